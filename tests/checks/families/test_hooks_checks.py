from __future__ import annotations

from dataclasses import replace

from checks.context import SecurityPolicy
from checks.results import FailureCode

HOOK = """\
def check_output(artifact, context):
    return "refund" in artifact.final_output

def detailed(artifact, context):
    return {"passed": False, "score": 0.25, "reason": "only 1 of 4 steps", "details": {"steps": 1}}

def broken(artifact, context):
    raise KeyError("order_id")

def wrong_type(artifact, context):
    return "yes"
"""


def _allowed(ctx):
    return replace(ctx, policy=SecurityPolicy(allow_python_hooks=True))


def _hook(name, **extra):
    return {"type": "python_hook", "path": "checks/my_check.py", "callable_name": name, **extra}


def _write(ctx):
    (ctx.spec_dir / "checks").mkdir(exist_ok=True)
    (ctx.spec_dir / "checks" / "my_check.py").write_text(HOOK)


def test_hook_refused_unless_policy_allows(run_check, ws_context):
    _write(ws_context)
    outcome = run_check(_hook("check_output"), context=ws_context, output="refund")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "set KEYSTONE_ALLOW_PYTHON_HOOKS=1" in outcome.message


def test_bool_hook_from_path(run_check, ws_context):
    _write(ws_context)
    assert run_check(
        _hook("check_output"), context=_allowed(ws_context), output="refund issued"
    ).passed
    outcome = run_check(_hook("check_output"), context=_allowed(ws_context), output="nothing")
    assert outcome.failure_code is FailureCode.PATTERN_FAILED
    assert "returned False" in outcome.message


def test_dict_hook(run_check, ws_context):
    _write(ws_context)
    outcome = run_check(_hook("detailed"), context=_allowed(ws_context))
    assert not outcome.passed
    assert outcome.score == 0.25
    assert outcome.message == "only 1 of 4 steps"
    assert outcome.details == {"steps": 1}


def test_import_path_hook(run_check, ws_context, tmp_path, monkeypatch):
    package = tmp_path / "importable"
    package.mkdir()
    (package / "keystone_test_hooks_mod.py").write_text(HOOK)
    monkeypatch.syspath_prepend(str(package))
    config = {
        "type": "python_hook",
        "import_path": "keystone_test_hooks_mod",
        "callable_name": "check_output",
    }
    assert run_check(config, context=_allowed(ws_context), output="refund ok").passed
    assert not run_check(config, context=_allowed(ws_context), output="nope").passed


def test_hook_errors_are_check_errors(run_check, ws_context):
    _write(ws_context)
    context = _allowed(ws_context)
    outcome = run_check(_hook("broken"), context=context)
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "KeyError" in outcome.message
    assert run_check(_hook("wrong_type"), context=context).failure_code is FailureCode.CHECK_ERROR
    assert run_check(_hook("missing_fn"), context=context).failure_code is FailureCode.CHECK_ERROR


def test_hook_bad_configuration(run_check, ws_context):
    _write(ws_context)
    context = _allowed(ws_context)
    both = {
        "type": "python_hook",
        "path": "checks/my_check.py",
        "import_path": "x",
        "callable_name": "f",
    }
    assert run_check(both, context=context).failure_code is FailureCode.CHECK_ERROR
    neither = {"type": "python_hook", "callable_name": "f"}
    assert run_check(neither, context=context).failure_code is FailureCode.CHECK_ERROR
    missing = {"type": "python_hook", "path": "nope.py", "callable_name": "f"}
    assert "not found" in run_check(missing, context=context).message
    bad_module = {"type": "python_hook", "import_path": "no_such_module_xyz", "callable_name": "f"}
    assert "ModuleNotFoundError" in run_check(bad_module, context=context).message
    (ws_context.spec_dir / "syntax.py").write_text("def f(:\n")
    syntax = {"type": "python_hook", "path": "syntax.py", "callable_name": "f"}
    assert "SyntaxError" in run_check(syntax, context=context).message
