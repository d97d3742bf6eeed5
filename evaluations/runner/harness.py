"""The harness: one planned execution, start to finish, with no Django in sight.

workspace -> services -> LLM gateway and tool proxy -> setup -> reset -> agent -> diff
-> RunArtifact -> checks -> forbidden rules -> cleanup. The Celery task and the in-process
CLI both call `run_execution`; what they do with the outcome (rows or a report) is theirs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.artifact import LLMCall, RunArtifact, ToolCall
from checks.context import CheckContext, Judge, SecurityPolicy
from checks.engine import evaluate
from checks.forbidden import evaluate_forbidden
from checks.planning import PlannedExecution
from checks.redaction import redact, redact_artifact, redact_results, usable_secrets
from checks.registry import get_check_class
from checks.results import PROVIDER_CODES, CheckResult
from checks.spec.model import CONVERSATION_ATTACKS, Scenario, Spec
from evaluations.runner import cgroups
from evaluations.runner import workspace as ws
from evaluations.runner.agent_start import ensure_started
from evaluations.runner.agents import invoke_agent, reset_agent
from evaluations.runner.audit import write_audit
from evaluations.runner.context_attacks import apply_to_messages
from evaluations.runner.egress import Endpoint
from evaluations.runner.outputs import collect_output_artifacts
from evaluations.runner.sandbox import (
    DEFAULT_DISK_MB,
    DEFAULT_MAX_PROCESSES,
    Sandbox,
    select_backend,
)
from evaluations.runner.services import ServiceSet

if TYPE_CHECKING:
    # Imported where an execution starts them (_world): a spec without `llm` or tools never
    # loads them.
    from evaluations.runner.gateway import Gateway
    from evaluations.runner.toolproxy import ToolProxy

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_OUTPUT = 10 * 1024 * 1024

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class HarnessConfig:
    """What the server (or the CLI) decides, as opposed to what the spec says."""

    workspaces_root: Path
    spec_dir: Path
    # True for specs written in the browser: their spec_dir is an empty stand-in, and
    # `sandbox.workspace` may not reach outside it (it would copy the server's files in).
    confine_to_spec_dir: bool = False
    sandbox_backend: str | None = None
    postgres_url: str | None = None
    mysql_url: str | None = None
    policy: SecurityPolicy = field(default_factory=SecurityPolicy)
    secrets: Mapping[str, str] = field(default_factory=dict)
    keep_workspace: bool = False
    judge: Judge | None = None  # llm_as_judge checks, drift/similarity by judge or embedding


@dataclass(slots=True)
class ExecutionOutcome:
    """What one execution produced: its artifact, check results, forbidden violations and
    warnings, secrets redacted; `workspace` is its directory (removed unless keep_workspace)."""

    artifact: RunArtifact
    results: list[CheckResult]
    forbidden_violations: list[dict[str, Any]]
    warnings: list[str]
    agent_cpu_ms: float = 0.0
    workspace: Path | None = None


def scenario_named(spec: Spec, name: str) -> Scenario:
    for scenario in spec.scenarios:
        if scenario.name == name:
            return scenario
    return Scenario(name)  # replay executions run without chaos


def run_execution(
    spec: Spec,
    planned: PlannedExecution,
    config: HarnessConfig,
    *,
    execution_key: str,
    seed: int = 0,
    baseline_output: str | None = None,
    sandbox: Sandbox | None = None,
) -> ExecutionOutcome:
    scenario = scenario_named(spec, planned.scenario)
    warnings: list[str] = []
    if sandbox is None:
        sandbox, warning = choose_sandbox(spec, config.sandbox_backend)
        if warning:
            warnings.append(warning)
    limited, why_not = cgroups.support()
    if not limited and sandbox.name != "docker":  # docker's engine enforces its own
        warnings.append(
            f"process-count and whole-tree memory limits are not enforced on this host: {why_not}"
        )
    sandbox_conf = spec.raw.get("sandbox") or {}
    resources = sandbox_conf.get("resources") or {}
    timeout = float(resources.get("timeout") or spec.agent.get("timeout") or DEFAULT_TIMEOUT)
    max_output = int(resources.get("max_output_bytes") or DEFAULT_MAX_OUTPUT)
    network = sandbox_conf.get("network", "services")

    workspace = ws.create_workspace(
        config.workspaces_root,
        spec_dir=config.spec_dir,
        source_dir=sandbox_conf.get("workspace"),
        files=sandbox_conf.get("files"),
        allow_outside_spec_dir=not config.confine_to_spec_dir,
        keep=config.keep_workspace,
    )
    warnings.extend(sandbox.run_warnings(workspace))
    started = time.time()
    try:
        with _world(spec, planned, scenario, config, workspace, execution_key, seed) as world:
            services, gateway, proxy = world
            env = _agent_env(spec, planned, workspace, services, gateway, proxy, config.secrets)
            egress = _egress(services, gateway, proxy)
            run_kwargs: dict[str, Any] = {
                "workspace": workspace,
                "env": env,
                "timeout": timeout,
                "max_output_bytes": max_output,
                "network": network,
                "egress": egress,
                "cpus": resources.get("cpus", 2),
                "memory_mb": resources.get("memory_mb", 2048),
                "max_processes": resources.get("max_processes", DEFAULT_MAX_PROCESSES),
                "disk_mb": resources.get("disk_mb", DEFAULT_DISK_MB),
            }
            setup_error = ensure_started(
                spec.agent,
                spec_dir=config.spec_dir,
                allowed=not config.confine_to_spec_dir or config.policy.allow_host_scripts,
            ) or _run_setup(spec, sandbox, run_kwargs)
            if not setup_error:
                # A reset that fails leaves the previous cell's state in the agent: the
                # execution would be judged on contaminated ground, so it does not run.
                reset_error = reset_agent(
                    spec.agent,
                    sandbox=sandbox,
                    workspace=workspace,
                    env=env,
                    spec_dir=config.spec_dir,
                    network=network,
                    egress=egress,
                )
                setup_error = f"agent reset failed: {reset_error}" if reset_error else None
            before = ws.snapshot(workspace)
            if setup_error:
                artifact = RunArtifact(
                    status="error", exit_code=None, error=setup_error, stderr=setup_error
                )
                agent_cpu_ms = 0.0
            else:
                result = invoke_agent(
                    spec.agent,
                    prompt=planned.prompt,
                    sandbox=sandbox,
                    spec_dir=config.spec_dir,
                    context=_agent_context(planned, scenario),
                    **run_kwargs,
                )
                agent_cpu_ms = result.agent_cpu_ms or 0.0
                artifact = RunArtifact(
                    final_output=result.final_output,
                    status=result.status,
                    exit_code=result.exit_code,
                    stdout=result.stdout,
                    stderr=result.stderr,
                    error=result.error,
                    tool_calls=[_tool_call(c) for c in result.tool_calls],
                    refused_connections=result.refused_connections,
                )
            artifact.workspace_path = str(workspace)
            artifact.workspace_diff = ws.diff(before, ws.snapshot(workspace), workspace)
            artifact.http_calls = services.http_log()
            artifact.db_writes = services.db_writes()
            if proxy is not None:
                artifact.tool_calls = artifact.tool_calls + proxy.calls()
            if gateway is not None:
                artifact.llm_calls = gateway.calls()
                failure = provider_failure(artifact.llm_calls, gateway.upstream_url)
                if failure is not None:
                    # The agent's model failed it (not an injected fault): Keystone cannot
                    # judge the agent, whatever it made of the error (exit code 3).
                    artifact.status = "provider_error"
                    artifact.error = failure
                    warnings.append(failure)
            artifact.input_tokens = sum(c.input_tokens for c in artifact.llm_calls)
            artifact.output_tokens = sum(c.output_tokens for c in artifact.llm_calls)
            artifact.cost_usd = sum(c.cost_usd for c in artifact.llm_calls)
            artifact.started_at = started
            artifact.finished_at = time.time()
            artifact.duration_ms = (artifact.finished_at - started) * 1000
            if proxy is not None:  # only the proxy's calls have a request to pair
                from evaluations.runner.toolproxy import with_model_arguments

                artifact.tool_calls = with_model_arguments(artifact.tool_calls, artifact.llm_calls)

            artifact.output_artifacts, output_warnings = collect_output_artifacts(
                workspace, spec.raw.get("output_artifacts") or []
            )
            warnings.extend(output_warnings)
            invariants = [spec.invariants[i] for i in planned.invariant_ids]
            audit_log_path: str | None = None
            trace_path: str | None = None
            # Only for a check that can read them: each file made and removed costs the
            # kernel more than writing it (ext4 without a journal skips every inode deleted
            # in the last minute, one by one, to allocate one; docs/performance.md).
            if any(get_check_class(i.check_type).reads_workspace for i in invariants):
                try:
                    audit_log_path, trace_path = write_audit(
                        workspace, artifact, _agent_label(spec.agent)
                    )
                except OSError as exc:  # the agent put a link where .keystone/ was: refused
                    warnings.append(f"audit and trace files not written: {exc}")
            context = CheckContext(
                workspace=workspace,
                spec_dir=config.spec_dir,
                prompt=planned.prompt,
                scenario=scenario.name,
                services=services.handles,
                policy=config.policy,
                run_command=sandbox.command_runner(workspace, env, network=network, egress=egress),
                baseline_output=baseline_output,
                sandbox_id=execution_key,
                judge=config.judge,
                audit_log_path=audit_log_path,
                trace_path=trace_path,
                scenario_params=_scenario_params(spec, planned, scenario, seed),
            )
            # Status `error`: the agent never did its task (its setup or reset failed, its
            # sandbox or container could not start, its module cannot be imported). No
            # invariant can say anything about it, and a check failing on the empty output
            # (or a command_exit in a container that never started) would blame the agent.
            # Scoring counts the execution as an error, with its reason.
            never_ran = artifact.status == "error"
            # A cancelled run keeps no results of its executions, and its checks (a judge's
            # calls, up to their timeout) would only keep the cancel waiting.
            cancelled = sandbox.stopped
            results = (
                [] if never_ran or cancelled else evaluate(artifact, invariants, context, scenario)
            )
            warnings.extend(_provider_warnings(results))
            secret_values = [
                config.secrets[name]
                for name in spec.raw.get("secrets") or []
                if name in config.secrets
            ]
            violations = evaluate_forbidden(spec.forbidden, artifact, secret_values=secret_values)
            # Detected on the raw artifact above; nothing stored or reported repeats them.
            secrets = usable_secrets(secret_values)
            artifact = redact_artifact(artifact, secrets)
            results = redact_results(results, secrets)
            violations = redact(violations, secrets)
            warnings = redact(warnings, secrets)
    finally:
        if not config.keep_workspace:
            # Also what the agent left read-only (rmtree's ignore_errors would leave it on
            # the disk); a failure to clean up does not change the execution's outcome.
            try:
                ws.remove_workspace(workspace)
            except OSError:
                logger.warning("could not remove the workspace %s", workspace, exc_info=True)
        # Last: the local backend's uid is given back only once nothing of the execution
        # (its processes, its workspace: taken back to root when it is kept or was not
        # removed) is left to the uid's next holder.
        try:
            sandbox.release(workspace if workspace.exists() else None)
        except Exception:  # noqa: BLE001 - cleaning up does not change the outcome either
            logger.warning("could not release the sandbox of %s", workspace, exc_info=True)
    return ExecutionOutcome(artifact, results, violations, warnings, agent_cpu_ms, workspace)


def gateway_wanted(spec_raw: Mapping[str, Any]) -> bool:
    """Whether an execution of this spec starts the LLM gateway: the spec has `llm`."""
    return bool(spec_raw.get("llm"))


def tool_proxy_wanted(spec_raw: Mapping[str, Any], *, replaying: bool) -> bool:
    """Whether an execution of this spec starts the tool proxy: the spec has `tools`, its
    python agent has tools (their callables are wrapped through the proxy even with no
    fault, so every call is in the trace), or the execution replays a session (the proxy
    serves its recorded answers)."""
    agent = spec_raw.get("agent") or {}
    python_tools = agent.get("type") == "python" and (
        agent.get("tools") or agent.get("tool_registry")
    )
    return bool(spec_raw.get("tools") or python_tools or replaying)


@contextlib.contextmanager
def _world(
    spec: Spec,
    planned: PlannedExecution,
    scenario: Scenario,
    config: HarnessConfig,
    workspace: Path,
    execution_key: str,
    seed: int,
) -> Iterator[tuple[ServiceSet, Gateway | None, ToolProxy | None]]:
    """Services, gateway and proxy for one execution; all torn down whatever happens."""
    with contextlib.ExitStack() as stack:
        services = stack.enter_context(
            ServiceSet(
                spec.services,
                spec_dir=config.spec_dir,
                execution_key=execution_key,
                postgres_url=config.postgres_url,
                mysql_url=config.mysql_url,
                sqlite_dir=workspace / ".keystone",
            )
        )
        gateway = None
        if gateway_wanted(spec.raw):
            from evaluations.runner.gateway import Gateway

            gateway = stack.enter_context(
                Gateway(
                    spec.raw["llm"],
                    llm_faults=scenario.llm_faults,
                    seed=seed,
                    secrets=config.secrets,
                    request_transforms=_conversation_attacks(scenario.context_attacks, seed),
                )
            )
        proxy = None
        replay = (planned.replay_session or {}).get("tool_responses")
        if tool_proxy_wanted(spec.raw, replaying=replay is not None):
            from evaluations.runner.toolproxy import ToolProxy

            service_urls = {
                name: h.describe().get("url", "") for name, h in services.handles.items()
            }
            proxy = stack.enter_context(
                ToolProxy(
                    spec.raw.get("tools") or [],
                    service_urls=service_urls,
                    tool_faults=scenario.tool_faults,
                    context_attacks=scenario.context_attacks,
                    seed=seed,
                    replay_responses=replay,
                )
            )
        yield services, gateway, proxy


def _egress(
    services: ServiceSet, gateway: Gateway | None, proxy: ToolProxy | None
) -> list[Endpoint]:
    """Every address this execution declared, the only ones `network: services` reaches:
    the gateway, the tool proxy, HTTP mocks, and the database services, each of those
    admitting only its own role and database."""
    urls = [url for url in (gateway and gateway.base_url, proxy and proxy.base_url) if url]
    endpoints = [e for e in map(Endpoint.from_url, urls) if e is not None]
    for handle in services.handles.values():
        described = handle.describe()
        if not described.get("port"):
            continue  # sqlite: a file in the workspace
        login = {}
        if described["type"] in ("postgres", "mysql"):
            login = {
                "protocol": described["type"],
                "user": described["user"],
                "database": described["database"],
            }
        endpoints.append(Endpoint(described["host"], int(described["port"]), **login))
    return endpoints


def _agent_context(planned: PlannedExecution, scenario: Scenario) -> dict[str, Any]:
    """The context a python agent gets beside its prompt; a replayed session's recorded
    context is part of it (command agents read it from $KEYSTONE_SESSION_CONTEXT)."""
    context: dict[str, Any] = {"scenario": scenario.name, "replica": planned.replica}
    if planned.replay_session is not None:
        context["session_context"] = planned.replay_session.get("context")
    return context


def choose_sandbox(spec: Spec, default_backend: str | None) -> tuple[Sandbox, str | None]:
    """The sandbox the spec asks for (or the server's default), in its `sandbox.image` when
    it is docker, and a warning for the run when it had to fall back."""
    conf = spec.raw.get("sandbox") or {}
    return select_backend(conf.get("backend") or default_backend, docker_image=conf.get("image"))


def _agent_label(agent: dict[str, Any]) -> str:
    """How the agent was invoked, for the audit's `command` event."""
    return str(agent.get("command") or agent.get("callable") or agent.get("url") or agent["type"])


def _scenario_params(
    spec: Spec, planned: PlannedExecution, scenario: Scenario, seed: int
) -> dict[str, Any]:
    """What this cell varies, for custom checks (reference 000's `scenario_params`): the
    scenario's faults and attacks, the model, the prompt, replica and the fault seed."""
    return {
        "scenario": scenario.name,
        "profile": scenario.profile,
        "tool_faults": scenario.tool_faults,
        "llm_faults": scenario.llm_faults,
        "context_attacks": scenario.context_attacks,
        "model": (spec.raw.get("llm") or {}).get("model"),
        "pillar": planned.pillar,
        "prompt_index": planned.prompt_index,
        "replica": planned.replica,
        "seed": seed,
    }


def provider_failure(llm_calls: list[LLMCall], endpoint: str | None) -> str | None:
    """Why the agent's model endpoint failed the execution, or None. Credentials refused
    (401/403) on any call; unreachable, timed out, rate limited or a server error on the
    last call, after which the agent had no working model. Injected faults never count."""
    real = [call for call in llm_calls if not call.fault]
    refused = [call for call in real if call.status in (401, 403)]
    failed = refused[:1] or [c for c in real[-1:] if c.status == 429 or c.status >= 500]
    if not failed:
        return None
    call = failed[0]
    error = call.response.get("error") if isinstance(call.response, dict) else None
    said = error.get("message") if isinstance(error, dict) else None
    where = endpoint or "the scripted provider"
    return f"model endpoint {where} answered {call.status}" + (f": {said}" if said else "")


def _provider_warnings(results: list[CheckResult]) -> list[str]:
    """A judge (or embedding) provider that failed marks the run: its results are errors,
    not verdicts, and the exit code is 3."""
    return [
        f"judge provider error in {r.invariant_id}: {r.failure_code}: {r.message[:300]}"
        for r in results
        if r.failure_code in PROVIDER_CODES
    ]


def _tool_call(record: dict[str, Any]) -> ToolCall:
    """A tool call a python agent's host recorded (the dict shape of checks.artifact.ToolCall)."""
    known = {k: v for k, v in record.items() if k in ToolCall.__dataclass_fields__}
    return ToolCall(**{"name": str(record.get("name", "")), **known})


def _conversation_attacks(attacks: list[dict[str, Any]], seed: int) -> list[Any]:
    """Context attacks on the conversation are applied where the model reads it: the gateway.
    `indirect_injection` goes into tool results instead, in the tool proxy."""
    conversational = [a for a in attacks if a.get("type") in CONVERSATION_ATTACKS]
    if not conversational:
        return []

    def transform(body: dict[str, Any], call_index: int) -> dict[str, Any]:
        rng = random.Random(f"{seed}:{call_index}")
        return {
            **body,
            "messages": apply_to_messages(body.get("messages") or [], conversational, rng),
        }

    return [transform]


def _agent_env(
    spec: Spec,
    planned: PlannedExecution,
    workspace: Path,
    services: ServiceSet,
    gateway: Gateway | None,
    proxy: ToolProxy | None,
    secrets: Mapping[str, str],
) -> dict[str, str]:
    """Only what the spec gives plus Keystone's own variables: never the server's environment."""
    env = {str(k): str(v) for k, v in (spec.agent.get("env") or {}).items()}
    # The spec's `secrets` are the only server variables an agent ever sees.
    env.update({name: secrets[name] for name in spec.raw.get("secrets") or [] if name in secrets})
    env.update(services.env)
    if proxy is not None:
        env.update(proxy.env)
    if gateway is not None:
        env.update(gateway.env())  # a per-execution token: the real key stays in the gateway
    env["KEYSTONE_WORKSPACE"] = str(workspace)
    env["KEYSTONE_SCENARIO"] = planned.scenario
    env["KEYSTONE_REPLICA"] = str(planned.replica)
    if planned.replay_session is not None:
        env["KEYSTONE_SESSION_CONTEXT"] = json.dumps(planned.replay_session.get("context"))
    return env


def _run_setup(spec: Spec, sandbox: Sandbox, run_kwargs: dict[str, Any]) -> str | None:
    for command in spec.raw.get("setup") or []:
        result = sandbox.run(command, stdin=None, **run_kwargs)
        if result.error is not None:  # the sandbox itself failed (a container that cannot start)
            return f"setup command {command!r} could not run: {result.error}"
        if result.limit_exceeded:
            return f"setup command {command!r} was killed: {result.limit_exceeded}"
        if result.timed_out:
            return f"setup command {command!r} timed out after {result.duration_ms / 1000:.1f}s"
        if result.exit_code != 0:
            said = (result.stderr or result.stdout)[-2000:].strip()
            return f"setup command {command!r} exited with code {result.exit_code}" + (
                f": {said}" if said else ""
            )
    return None
