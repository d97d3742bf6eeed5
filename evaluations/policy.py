"""The operator's policy: what a spec may ask of this server. A spec is written by any editor
of a project; it must not decide its own privileges (a weaker sandbox, the server's own
secrets, limits nobody would allow). The policy is read from the environment
(KEYSTONE_POLICY_*, README "Configuration"), checked when a spec is uploaded, when a run is
planned and again when each execution starts (the policy may have tightened since), and
shown on the project settings page. Every refusal names the setting that would allow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

# Weakest first: a floor of bwrap allows bwrap and docker, never local processes.
BACKEND_STRENGTH = {"local": 0, "bwrap": 1, "docker": 2}

# Keystone's own settings and the credentials of what it runs on: never handed to an agent,
# whatever the allow-list says.
SERVER_SECRET_NAMES = frozenset(
    {"SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
)
SERVER_SECRET_PREFIXES = ("KEYSTONE_", "DJANGO_", "CELERY_", "PG", "POSTGRES", "MYSQL", "AWS_")


class PolicyError(ValueError):
    """A spec or a run the operator's policy refuses; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's limits on what a spec may ask of this server (KEYSTONE_POLICY_*)."""

    min_backend: str
    allowed_secrets: frozenset[str] | None  # None: any name that is not the server's own
    max_timeout_seconds: float
    max_output_bytes: int
    max_memory_mb: int
    max_cpus: float
    max_executions: int
    max_processes: int = 4096
    max_disk_mb: int = 10240
    allow_host_network: bool = False

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, value, setting) for the settings page."""
        secrets = (
            ", ".join(sorted(self.allowed_secrets))
            if self.allowed_secrets is not None
            else "any, except the server's own settings"
        )
        return [
            ("weakest sandbox backend", self.min_backend, "KEYSTONE_POLICY_MIN_BACKEND"),
            ("secrets a spec may pass", secrets or "none", "KEYSTONE_POLICY_ALLOWED_SECRETS"),
            ("longest timeout (s)", f"{self.max_timeout_seconds:g}", "KEYSTONE_POLICY_MAX_TIMEOUT"),
            (
                "largest output (bytes)",
                str(self.max_output_bytes),
                "KEYSTONE_POLICY_MAX_OUTPUT_BYTES",
            ),
            ("most memory (MB)", str(self.max_memory_mb), "KEYSTONE_POLICY_MAX_MEMORY_MB"),
            ("most CPUs", f"{self.max_cpus:g}", "KEYSTONE_POLICY_MAX_CPUS"),
            ("most processes", str(self.max_processes), "KEYSTONE_POLICY_MAX_PROCESSES"),
            ("most disk per workspace (MB)", str(self.max_disk_mb), "KEYSTONE_POLICY_MAX_DISK_MB"),
            ("most executions per run", str(self.max_executions), "KEYSTONE_POLICY_MAX_EXECUTIONS"),
            (
                "the host's network (sandbox.network: host)",
                "allowed" if self.allow_host_network else "refused",
                "KEYSTONE_POLICY_ALLOW_HOST_NETWORK",
            ),
        ]


def current() -> Policy:
    allowed = settings.KEYSTONE_POLICY_ALLOWED_SECRETS
    return Policy(
        min_backend=settings.KEYSTONE_POLICY_MIN_BACKEND or _default_min_backend(),
        allowed_secrets=None if allowed is None else frozenset(allowed),
        max_timeout_seconds=settings.KEYSTONE_POLICY_MAX_TIMEOUT,
        max_output_bytes=settings.KEYSTONE_POLICY_MAX_OUTPUT_BYTES,
        max_memory_mb=settings.KEYSTONE_POLICY_MAX_MEMORY_MB,
        max_cpus=settings.KEYSTONE_POLICY_MAX_CPUS,
        max_executions=settings.KEYSTONE_POLICY_MAX_EXECUTIONS,
        max_processes=settings.KEYSTONE_POLICY_MAX_PROCESSES,
        max_disk_mb=settings.KEYSTONE_POLICY_MAX_DISK_MB,
        allow_host_network=settings.KEYSTONE_POLICY_ALLOW_HOST_NETWORK,
    )


def _default_min_backend() -> str:
    from evaluations.runner.sandbox import bwrap_available

    return "bwrap" if bwrap_available() else "local"


def is_server_secret(name: str) -> bool:
    return name in SERVER_SECRET_NAMES or name.startswith(SERVER_SECRET_PREFIXES)


def secret_refusal(name: str, policy: Policy | None = None) -> str | None:
    """Why a spec may not have the server's variable `name` (as a secret or a model's key),
    or None when it may."""
    policy = policy or current()
    if is_server_secret(name):
        return f"'{name}' is one of the server's own settings: never passed"
    if policy.allowed_secrets is not None and name not in policy.allowed_secrets:
        return f"'{name}' is not allowed (add it to KEYSTONE_POLICY_ALLOWED_SECRETS)"
    return None


def spec_refusals(parsed: dict[str, Any], policy: Policy | None = None) -> list[tuple[str, str]]:
    """(YAML path, why) for every part of a validated spec the policy refuses."""
    policy = policy or current()
    problems: list[tuple[str, str]] = []
    sandbox = parsed.get("sandbox") or {}
    backend = sandbox.get("backend")
    if backend and BACKEND_STRENGTH.get(backend, 0) < BACKEND_STRENGTH[policy.min_backend]:
        problems.append(
            (
                "sandbox.backend",
                f"'{backend}' is weaker than this server allows ('{policy.min_backend}'; "
                "set KEYSTONE_POLICY_MIN_BACKEND to allow it)",
            )
        )
    if sandbox.get("network") == "host" and not policy.allow_host_network:
        problems.append(
            (
                "sandbox.network",
                "'host' would let the agent reach everything the worker can, this server's "
                "own database included (set KEYSTONE_POLICY_ALLOW_HOST_NETWORK=true to allow it)",
            )
        )
    named = [(f"secrets[{i}]", name) for i, name in enumerate(parsed.get("secrets") or [])]
    # The variable holding a model's key is a secret the spec names too: the worker sends its
    # value as a bearer token to the spec's own `base_url`, wherever that points.
    for block in ("llm", "judge"):
        key_env = (parsed.get(block) or {}).get("api_key_env")
        if key_env:
            named.append((f"{block}.api_key_env", key_env))
    for path, name in named:
        why = secret_refusal(str(name), policy)
        if why:
            problems.append((path, why))
    resources = sandbox.get("resources") or {}
    ceilings = (
        ("timeout", policy.max_timeout_seconds, "KEYSTONE_POLICY_MAX_TIMEOUT"),
        ("max_output_bytes", policy.max_output_bytes, "KEYSTONE_POLICY_MAX_OUTPUT_BYTES"),
        ("memory_mb", policy.max_memory_mb, "KEYSTONE_POLICY_MAX_MEMORY_MB"),
        ("cpus", policy.max_cpus, "KEYSTONE_POLICY_MAX_CPUS"),
        ("max_processes", policy.max_processes, "KEYSTONE_POLICY_MAX_PROCESSES"),
        ("disk_mb", policy.max_disk_mb, "KEYSTONE_POLICY_MAX_DISK_MB"),
    )
    for key, ceiling, setting in ceilings:
        value = resources.get(key)
        if isinstance(value, int | float) and value > ceiling:
            problems.append(
                (
                    f"sandbox.resources.{key}",
                    f"{value:g} is above this server's ceiling of {ceiling:g} (set {setting})",
                )
            )
    timeout = (parsed.get("agent") or {}).get("timeout")
    if isinstance(timeout, int | float) and timeout > policy.max_timeout_seconds:
        problems.append(
            (
                "agent.timeout",
                f"{timeout:g} is above this server's ceiling of "
                f"{policy.max_timeout_seconds:g} (set KEYSTONE_POLICY_MAX_TIMEOUT)",
            )
        )
    return problems


def check_backend(name: str, policy: Policy | None = None) -> None:
    """The backend an execution really got (the default may fall back) against the floor."""
    policy = policy or current()
    if BACKEND_STRENGTH.get(name, 0) < BACKEND_STRENGTH[policy.min_backend]:
        raise PolicyError(
            f"the sandbox backend here would be '{name}', weaker than this server allows "
            f"('{policy.min_backend}'; set KEYSTONE_POLICY_MIN_BACKEND to allow it)"
        )


def check_plan_size(count: int, policy: Policy | None = None) -> None:
    policy = policy or current()
    if count > policy.max_executions:
        raise PolicyError(
            f"the run plans {count} executions; this server allows {policy.max_executions} "
            "per run (set KEYSTONE_POLICY_MAX_EXECUTIONS)"
        )
