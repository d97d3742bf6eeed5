"""`custom`: a user's script decides. Context JSON on stdin (reference 000's protocol plus
`final_output`), `{passed, score?, reason?, details?}` on stdout. A non-zero exit or
unparsable stdout is a CHECK_ERROR: the script broke, the agent did not fail.

runs_in: host runs the script on this server (refused unless the security policy allows
host scripts) against a read-only copy of the workspace, so a script cannot change what the
checks after it see (reference 000: read-only access); runs_in: sandbox copies it to the workspace under .keystone/checks/ and runs it
through the sandbox's command runner, next to what the agent installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext, CommandResult
from checks.families._common import (
    ConfigError,
    get_number,
    get_str,
    guarded,
    resolve_inside,
    tail,
    verdict_from,
    workspace_root,
)
from checks.results import Outcome

SANDBOX_SCRIPT_DIR = ".keystone/checks"


def script_context(artifact: RunArtifact, context: CheckContext) -> dict[str, Any]:
    """What the script reads on stdin."""
    workspace = context.workspace or artifact.workspace_path
    return {
        "sandbox_id": context.sandbox_id,
        "workspace_path": str(workspace) if workspace else None,
        "services": {name: service.describe() for name, service in context.services.items()},
        "audit_log_path": context.audit_log_path,
        "trace_path": context.trace_path,
        "task": {"prompt": context.prompt},
        "scenario_params": context.scenario_params,
        "final_output": artifact.final_output,
    }


def parse_script_output(stdout: str) -> dict[str, Any]:
    """The script's verdict: the whole stdout as JSON, or else its last line (scripts that
    print progress first)."""
    text = stdout.strip()
    candidates = [text] + ([text.splitlines()[-1]] if "\n" in text else [])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            if not isinstance(value.get("passed"), bool):
                raise ConfigError("the script's JSON has no boolean 'passed'")
            return value
    raise ConfigError(f"the script's stdout is not a JSON object: {tail(text, 300)!r}")


class CustomCheck(Check):
    type = "custom"
    reads_workspace = True

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        script_name = get_str(self.config, "script")
        runs_in = get_str(self.config, "runs_in", "host")
        timeout = get_number(self.config, "timeout", 60)
        if timeout <= 0:
            raise ConfigError("'timeout' must be positive")
        script = resolve_inside(context.spec_dir, script_name, "script")
        if not script.is_file():
            raise ConfigError(f"script {script_name!r} not found next to the spec")
        if runs_in == "host":
            if not context.policy.allow_host_scripts:
                raise ConfigError(
                    "host scripts are disabled by the server's security policy: set"
                    " KEYSTONE_ALLOW_HOST_SCRIPTS=1 to allow runs_in: host, or use runs_in: sandbox"
                )
            with read_only_view(context.workspace or artifact.workspace_path) as view:
                seen = _seen_through(view, context)
                stdin = json.dumps(script_context(artifact, seen), default=str)
                result = self._run_on_host(script, stdin, timeout, artifact, seen)
        elif runs_in == "sandbox":
            stdin = json.dumps(script_context(artifact, context), default=str)
            result = self._run_in_sandbox(script, stdin, timeout, artifact, context)
        else:
            raise ConfigError(f"runs_in must be 'host' or 'sandbox', got {runs_in!r}")

        streams: dict[str, Any] = {
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
        }
        if result.error is not None:  # the sandbox never ran the script: no verdict
            return Outcome.error(
                f"the sandbox could not run script {script_name}: {result.error}", **streams
            )
        if result.timed_out:
            return Outcome.error(f"script {script_name} timed out after {timeout:g}s", **streams)
        if result.exit_code != 0:
            said = tail((result.stderr or result.stdout).strip(), 300)
            return Outcome.error(
                f"script {script_name} exited with code {result.exit_code}"
                + (f": {said}" if said else ""),
                **streams,
            )
        outcome = verdict_from(parse_script_output(result.stdout))
        outcome.details.setdefault("script", script_name)
        if result.stderr.strip():
            outcome.details.setdefault("stderr_tail", tail(result.stderr))
        return outcome

    @staticmethod
    def _run_on_host(
        script: Path, stdin: str, timeout: float, artifact: RunArtifact, context: CheckContext
    ) -> CommandResult:
        command = [sys.executable, str(script)] if script.suffix == ".py" else [str(script)]
        workspace = context.workspace or artifact.workspace_path
        cwd = str(workspace) if workspace and Path(workspace).is_dir() else str(context.spec_dir)
        try:
            done = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = (
                exc.stdout.decode(errors="replace")
                if isinstance(exc.stdout, bytes)
                else exc.stdout or ""
            )
            err = (
                exc.stderr.decode(errors="replace")
                if isinstance(exc.stderr, bytes)
                else exc.stderr or ""
            )
            return CommandResult(-1, out, err, timed_out=True)
        except OSError as exc:
            raise ConfigError(f"cannot run script {script.name}: {exc.strerror or exc}") from exc
        return CommandResult(done.returncode, done.stdout, done.stderr)

    @staticmethod
    def _run_in_sandbox(
        script: Path, stdin: str, timeout: float, artifact: RunArtifact, context: CheckContext
    ) -> CommandResult:
        # The sandbox sees the workspace, so the script is placed there and run by relative path.
        # Written without following links: the agent could have planted one at this path.
        root = workspace_root(artifact, context)
        placed = f"{SANDBOX_SCRIPT_DIR}/{script.name}"
        try:
            safe_files.write_bytes(root, placed, script.read_bytes(), mode=0o755)
        except OSError as exc:
            raise ConfigError(f"cannot place script {script.name} in the workspace: {exc}") from exc
        relative = shlex.quote(placed)
        command = f"python3 {relative}" if script.suffix == ".py" else f"./{relative}"
        try:
            runner = context.command_runner()
        except RuntimeError as exc:
            raise ConfigError(str(exc)) from exc
        try:
            return runner(command, stdin=stdin, timeout=timeout)
        finally:
            safe_files.remove(root, placed)


@contextmanager
def read_only_view(workspace: str | Path | None) -> Iterator[tuple[Path, Path] | None]:
    """(workspace, copy): a copy of the workspace whose files and directories are read-only,
    removed afterwards. A copy rather than a read-only mount so it works on every host and
    for every user: the modes make a careless write fail where the worker is not root, and
    whatever a script does to its copy (root ignores the modes) never reaches the workspace. Links are copied as links and special files (a FIFO the agent planted) are left
    out, so making the copy never blocks or reads outside the workspace."""
    if not workspace or not Path(workspace).is_dir():
        yield None
        return
    source = Path(workspace)
    parent = Path(tempfile.mkdtemp(prefix="keystone-script-view-"))
    copy = parent / source.name
    try:
        shutil.copytree(source, copy, symlinks=True, ignore=_special_files)
        for root, dirs, files in os.walk(copy):
            for name in files:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o444)
            for name in dirs:
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o555)
        os.chmod(copy, 0o555)
        yield source, copy
    finally:
        # Directories must be writable again before their entries can be removed.
        for root, dirs, _files in os.walk(parent):
            os.chmod(root, 0o755)
            for name in dirs:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o755)
        shutil.rmtree(parent, ignore_errors=True)


def _special_files(directory: str, names: list[str]) -> list[str]:
    """Entries copytree must skip: anything but regular files, directories and links."""
    skipped = []
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skipped.append(name)
    return skipped


def _seen_through(view: tuple[Path, Path] | None, context: CheckContext) -> CheckContext:
    """The context with the workspace and the audit/trace files inside it moved to the copy."""
    if view is None:
        return context
    source, copy = view

    def moved(path: str | None) -> str | None:
        if path and Path(path).is_relative_to(source):
            return str(copy / Path(path).relative_to(source))
        return path

    return replace(
        context,
        workspace=copy,
        audit_log_path=moved(context.audit_log_path),
        trace_path=moved(context.trace_path),
    )


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (CustomCheck,)
