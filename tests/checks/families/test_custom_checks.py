from __future__ import annotations

import json
import os
from dataclasses import replace

from checks.artifact import RunArtifact
from checks.context import SecurityPolicy
from checks.results import FailureCode

ECHO_CONTEXT = """\
import json, sys
ctx = json.load(sys.stdin)
print("progress: checking", file=sys.stderr)
print(json.dumps({"passed": ctx["final_output"] == "42", "score": 0.9 if ctx["final_output"] == "42" else 0.1,
                  "reason": "answer checked", "details": {"seen": ctx}}))
"""


def _host(ctx):
    return replace(ctx, policy=SecurityPolicy(allow_host_scripts=True))


class Service:
    name = "db"
    type = "postgres"

    def query(self, sql):
        return []

    def recorded_requests(self):
        return []

    def describe(self):
        return {"host": "127.0.0.1", "port": 5432}


def test_host_script_receives_the_documented_context(run_check, ws_context, workspace):
    (ws_context.spec_dir / "checks").mkdir()
    (ws_context.spec_dir / "checks" / "verify.py").write_text(ECHO_CONTEXT)
    context = _host(ws_context)
    context.prompt = "What is six times seven?"
    context.sandbox_id = "sb-1"
    context.scenario_params = {"model": "m1"}
    context.audit_log_path = "/x/audit.jsonl"
    context.services = {"db": Service()}
    outcome = run_check(
        {"type": "custom", "script": "checks/verify.py"}, context=context, output="42"
    )
    assert outcome.passed
    assert outcome.score == 0.9
    assert outcome.message == "answer checked"
    seen = outcome.details["seen"]
    # A read-only copy of the workspace (see the read-only test below), named like it.
    copy = seen.pop("workspace_path")
    assert copy != str(workspace) and copy.endswith("/" + workspace.name)
    assert seen == {
        "sandbox_id": "sb-1",
        "services": {"db": {"host": "127.0.0.1", "port": 5432}},
        "audit_log_path": "/x/audit.jsonl",
        "trace_path": None,
        "task": {"prompt": "What is six times seven?"},
        "scenario_params": {"model": "m1"},
        "final_output": "42",
    }
    assert "progress" in outcome.details["stderr_tail"]


def test_script_saying_failed_is_a_failure_with_its_own_code(run_check, ws_context):
    (ws_context.spec_dir / "v.py").write_text(
        'import json; print(json.dumps({"passed": False, "reason": "3 of 5 numbers differ", "failure_code": "SQL_MISMATCH"}))'
    )
    outcome = run_check({"type": "custom", "script": "v.py"}, context=_host(ws_context))
    assert outcome.failure_code is FailureCode.SQL_MISMATCH
    assert outcome.message == "3 of 5 numbers differ"
    (ws_context.spec_dir / "w.py").write_text("print('{\"passed\": false}')")
    assert (
        run_check({"type": "custom", "script": "w.py"}, context=_host(ws_context)).failure_code
        is FailureCode.PATTERN_FAILED
    )


def test_script_exiting_non_zero_is_check_error(run_check, ws_context):
    (ws_context.spec_dir / "broken.py").write_text(
        "import sys; print('db unreachable', file=sys.stderr); sys.exit(1)"
    )
    outcome = run_check({"type": "custom", "script": "broken.py"}, context=_host(ws_context))
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert outcome.message == "script broken.py exited with code 1: db unreachable"


def test_unparsable_stdout_is_check_error(run_check, ws_context):
    (ws_context.spec_dir / "chatty.py").write_text("print('all good!')")
    outcome = run_check({"type": "custom", "script": "chatty.py"}, context=_host(ws_context))
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "not a JSON object" in outcome.message
    (ws_context.spec_dir / "nopass.py").write_text("print('{\"score\": 1}')")
    outcome = run_check({"type": "custom", "script": "nopass.py"}, context=_host(ws_context))
    assert "boolean 'passed'" in outcome.message


def test_last_line_json_after_progress_output(run_check, ws_context):
    (ws_context.spec_dir / "p.py").write_text('print("step 1"); print(\'{"passed": true}\')')
    assert run_check({"type": "custom", "script": "p.py"}, context=_host(ws_context)).passed


def test_host_scripts_refused_by_default_policy(run_check, ws_context):
    (ws_context.spec_dir / "v.py").write_text("print('{\"passed\": true}')")
    outcome = run_check({"type": "custom", "script": "v.py"}, context=ws_context)
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "set KEYSTONE_ALLOW_HOST_SCRIPTS=1" in outcome.message


def test_non_python_host_script_is_executed_directly(run_check, ws_context):
    script = ws_context.spec_dir / "check.sh"
    script.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"passed": true, "reason": "from sh"}\'\n')
    script.chmod(0o755)
    outcome = run_check({"type": "custom", "script": "check.sh"}, context=_host(ws_context))
    assert outcome.passed and outcome.message == "from sh"


def test_sandbox_script_runs_in_the_workspace_via_the_runner(run_check, ws_context, workspace):
    (workspace / "result.txt").write_text("42")
    (ws_context.spec_dir / "in_sandbox.py").write_text(
        "import json, os, sys\nctx = json.load(sys.stdin)\n"
        "print(json.dumps({'passed': open('result.txt').read() == '42', 'details': {'cwd': os.getcwd()}}))\n"
    )
    outcome = run_check(
        {"type": "custom", "script": "in_sandbox.py", "runs_in": "sandbox"}, context=ws_context
    )
    assert outcome.passed, outcome.message
    assert outcome.details["cwd"] == str(workspace)
    # The copied script does not stay behind in the agent's workspace.
    assert not (workspace / ".keystone" / "checks" / "in_sandbox.py").exists()


def test_script_timeout_is_check_error(run_check, ws_context):
    (ws_context.spec_dir / "slow.py").write_text("import time; time.sleep(5)")
    outcome = run_check(
        {"type": "custom", "script": "slow.py", "timeout": 0.3}, context=_host(ws_context)
    )
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "timed out" in outcome.message


def test_bad_configuration(run_check, ws_context):
    context = _host(ws_context)
    assert (
        run_check({"type": "custom", "script": "missing.py"}, context=context).failure_code
        is FailureCode.CHECK_ERROR
    )
    assert (
        run_check({"type": "custom", "script": "../../etc/passwd"}, context=context).failure_code
        is FailureCode.CHECK_ERROR
    )
    (ws_context.spec_dir / "v.py").write_text("print('{\"passed\": true}')")
    outcome = run_check({"type": "custom", "script": "v.py", "runs_in": "cloud"}, context=context)
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_context_json_is_valid_for_artifact_without_workspace(run_check, ws_context):
    from checks.families.custom import script_context

    data = script_context(RunArtifact(final_output="x"), replace(ws_context, workspace=None))
    assert json.loads(json.dumps(data))["workspace_path"] is None


def test_host_script_sees_a_read_only_copy_of_the_workspace(run_check, ws_context, workspace):
    """Issue 12, item 6: reference 000 gives host scripts read-only access; whatever a script
    writes or deletes (even as root, which file modes do not stop) never reaches the workspace
    the later checks read."""
    (workspace / "result.txt").write_text("42")
    (workspace / ".keystone").mkdir(exist_ok=True)
    (workspace / ".keystone" / "audit.jsonl").write_text("{}\n")
    (ws_context.spec_dir / "vandal.py").write_text(
        "import json, os, sys\nctx = json.load(sys.stdin)\nws = ctx['workspace_path']\n"
        "before = open(os.path.join(ws, 'result.txt')).read()\n"
        "for attempt in (lambda: open(ctx['audit_log_path'], 'a').write('forged'),\n"
        "                lambda: open(os.path.join(ws, 'result.txt'), 'w').write('0'),\n"
        "                lambda: os.remove(os.path.join(ws, 'result.txt')),\n"
        "                lambda: open(os.path.join(ws, 'new.txt'), 'w').write('x')):\n"
        "    try:\n        attempt()\n    except OSError:\n        pass\n"
        "print(json.dumps({'passed': before == '42', 'details': {'cwd': os.getcwd(), 'ws': ws,\n"
        "                  'audit': ctx['audit_log_path']}}))\n"
    )
    context = _host(ws_context)
    context.audit_log_path = str(workspace / ".keystone" / "audit.jsonl")
    outcome = run_check({"type": "custom", "script": "vandal.py"}, context=context)
    assert outcome.passed, outcome.message  # the copy holds the agent's files
    seen = outcome.details
    assert seen["ws"] != str(workspace) and seen["cwd"] == seen["ws"]
    assert seen["audit"] == seen["ws"] + "/.keystone/audit.jsonl"
    assert (workspace / "result.txt").read_text() == "42"
    assert not (workspace / "new.txt").exists()
    assert (workspace / ".keystone" / "audit.jsonl").read_text() == "{}\n"
    assert not os.path.exists(seen["ws"])  # the copy is removed afterwards
