"""Issue 18: what a `keystone` command pays before it does its work. `keystone run` migrates
the embedded database only when a migration is pending, django.setup() does not import the
web API's libraries, and `validate` and a local `run` import neither Celery nor the modules
of pages they do not use."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from checks.json_schema import FORMAT_LIBRARIES
from evaluations.cli_commands import migrations_pending
from tests.cli_helpers import REPO_ROOT, embedded_env, run_keystone

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def test_no_migration_is_pending_on_a_migrated_database() -> None:
    assert not migrations_pending()


def test_a_migration_file_not_recorded_as_applied_is_pending() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = %s AND name = %s",
            ["evaluations", "0001_initial"],
        )
    assert migrations_pending()


def _printed_by(code: str, env: dict[str, str], timeout: float = 120) -> str:
    """What `code` printed, run by a fresh Python process in the repository."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def _json_printed_by(code: str, env: dict[str, str], timeout: float = 120) -> Any:
    """The JSON value on the last line `code` printed (a fresh Python process)."""
    return json.loads(_printed_by(code, env, timeout).splitlines()[-1])


def test_django_setup_imports_neither_ninja_nor_pydantic(tmp_path: Path) -> None:
    """/api/docs serves ninja's files by path (settings): no CLI command pays for ninja."""
    code = (
        "import os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'keystone_web.settings'\n"
        "import django; django.setup()\n"
        "print(sorted(m for m in ('ninja', 'pydantic') if m in sys.modules))"
    )
    assert _printed_by(code, embedded_env(tmp_path), timeout=60) == "[]"


# Imported by neither `keystone validate` nor a local `keystone run` of a spec without a
# model, tools or a judge: Celery (no broker: the queue runs the jobs itself), the pages'
# selectors, the libraries of jsonschema's format checks when no schema check runs
# (checks/json_schema.py), the parts of an execution such a spec does not have, the alerts
# (a project without alert rules has nothing to evaluate) and the admin's registrations.
SPEC_PARTS = (
    "evaluations.runner.gateway",
    "evaluations.runner.toolproxy",
    "checks.judge_client",
    "evaluations.services.reviews",
    "evaluations.selectors.reviews",
    "evaluations.runner.mutations",
    "evaluations.runner.replay",
)
NOT_AT_START_UP = (
    "celery",
    "kombu",
    "evaluations.tasks",
    "evaluations.selectors.digest",
    "evaluations.selectors.trends",
    "evaluations.services.digest",
    "evaluations.services.alerts",
    "evaluations.selectors.alerts",
    "evaluations.admin",  # the admin's registrations: keystone_web/urls.py imports them
    *FORMAT_LIBRARIES,
    *SPEC_PARTS,
)

NO_OP_SPEC = """\
version: 1
id: startup-noop
task: {prompts: ["p"]}
agent: {type: command, command: "true"}
sandbox: {backend: local}
replicas: 1
invariants:
  completes: {description: "it ran", check: {type: completes}}
"""


def _modules_after(
    tmp_path: Path, *argv: str, among: tuple[str, ...] = NOT_AT_START_UP
) -> list[str]:
    """The modules `among` loaded once `keystone ARGV` has run, in a fresh process."""
    code = (
        "import json, sys\n"
        "from evaluations.cli import main\n"
        f"code = main({list(argv)!r})\n"
        f"loaded = sorted(m for m in {among!r} if m in sys.modules)\n"
        "print(json.dumps([code, loaded]))"
    )
    exit_code, loaded = _json_printed_by(
        code, embedded_env(tmp_path / "home", KEYSTONE_POLICY_MIN_BACKEND="local")
    )
    assert exit_code == 0, loaded
    return list(loaded)


def test_validate_does_not_import_celery(tmp_path: Path) -> None:
    spec = REPO_ROOT / "examples" / "specs" / "calculator-fix.yaml"
    assert _modules_after(tmp_path, "validate", str(spec)) == []


def test_a_local_run_imports_neither_celery_nor_pages(tmp_path: Path) -> None:
    spec = tmp_path / "noop.yaml"
    spec.write_text(NO_OP_SPEC, encoding="utf-8")
    assert _modules_after(tmp_path, "run", str(spec)) == []


def test_a_run_imports_the_part_of_an_execution_its_spec_has(tmp_path: Path) -> None:
    """A spec with a model gets its gateway (and its executions their model calls), and
    still none of the parts it does not have: with two jobs, imported before the fork."""
    spec = tmp_path / "with-llm.yaml"
    spec.write_text(
        NO_OP_SPEC.replace("replicas: 1", "replicas: 2")
        + "llm: {provider: scripted, rules: [{reply: {content: hi}}]}\n",
        encoding="utf-8",
    )
    loaded = _modules_after(tmp_path, "run", str(spec), "--jobs", "2", among=SPEC_PARTS)
    assert loaded == ["evaluations.runner.gateway"]


@pytest.mark.parametrize("package", ["evaluations.services", "evaluations.selectors"])
def test_a_lazy_package_exports_each_name_from_its_module(package: str) -> None:
    """services and selectors import a module when one of its names is first used: each
    lazy name is in __all__ and is its module's object, and no name in __all__ is shadowed
    by a submodule of the same name (imported after the package)."""
    module = importlib.import_module(package)
    where = module._MODULE_OF
    assert set(where) <= set(module.__all__)
    for name, submodule in where.items():
        defined = importlib.import_module(f"{package}.{submodule}")
        assert getattr(module, name) is getattr(defined, name), name
    for name in module.__all__:
        assert not isinstance(getattr(module, name), types.ModuleType), name
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_a_celery_worker_imports_the_execution_path_and_freezes_the_collector_before_forking(
    tmp_path: Path,
) -> None:
    """keystone_web/celery.py: the pool's children share those pages instead of each holding
    a copy (bench/bench_throughput.py reports the workers' PSS)."""
    code = (
        "import gc, json, os, sys\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'keystone_web.settings'\n"
        "import django; django.setup()\n"
        "from celery.signals import worker_init\n"
        "from keystone_web.celery import app\n"
        f"wanted = ['evaluations.runner.harness', 'evaluations.judge', *{SPEC_PARTS!r}]\n"
        "before = [m in sys.modules for m in wanted]\n"
        "worker_init.send(sender=None)\n"
        "print(json.dumps([before, [m in sys.modules for m in wanted], gc.get_freeze_count()]))"
    )
    before, after, frozen = _json_printed_by(code, embedded_env(tmp_path), timeout=60)
    assert not any(before) and all(after)
    assert frozen > 10_000  # the objects of Django and the runner, out of the collector's way


def test_a_celery_worker_imports_neither_celery_s_command_line_nor_the_web_app(
    tmp_path: Path,
) -> None:
    """keystone_web/worker.py builds the worker through Celery's API (its command line
    imports an interactive shell), and the worker skips Django's system checks, whose URL
    check imports every view and the REST API: ~25 MB of each worker's tree (issue 18).
    The real Worker is built, so its start-up signals (Celery's Django fix-up) have run;
    only `start`, which would consume the broker's queue, is replaced by the report."""
    code = (
        "import json, sys\n"
        "from celery.apps.worker import Worker\n"
        "def report(worker):\n"
        "    loaded = [m for m in ('click_repl', 'prompt_toolkit', 'keystone_web.urls',\n"
        "              'ninja', 'pydantic', 'evaluations.runner.harness') if m in sys.modules]\n"
        "    print(json.dumps([loaded, worker.hostname, worker.concurrency]))\n"
        "Worker.start = report\n"
        "from keystone_web.worker import main\n"
        "main(['--concurrency', '3', '--loglevel', 'warning', '--hostname', 'one@%h',\n"
        "      '--without-gossip', '--without-mingle'])"
    )
    env = embedded_env(tmp_path) | {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/15"}
    loaded, hostname, concurrency = _json_printed_by(code, env, timeout=60)
    assert loaded == ["evaluations.runner.harness"]  # imported for the pool, nothing else
    assert hostname.startswith("one@") and "%h" not in hostname
    assert concurrency == 3


@pytest.mark.parametrize(
    "start_up",
    [
        "from evaluations.cli_commands import setup_django; setup_django(migrate=False)",
        "from evaluations.cli import cmd_validate; import argparse\n"
        "cmd_validate(argparse.Namespace(specs=['examples/specs/calculator-fix.yaml']))",
    ],
    ids=["django", "validate"],
)
def test_the_command_collects_garbage_again_once_its_start_up_is_over(
    tmp_path: Path, start_up: str
) -> None:
    """evaluations.cli.command turns the collector off for the start-up (imports,
    django.setup()) and back on, with what start-up made frozen, before the command's work:
    a worker or a server that ran with it off would never free a reference cycle."""
    code = (
        "import gc, json\n"
        "gc.disable()  # as evaluations.cli.command does\n"
        f"{start_up}\n"
        "print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))"
    )
    enabled, frozen = _json_printed_by(code, embedded_env(tmp_path / "home"), timeout=60)
    assert enabled is True
    assert frozen > 10_000


def test_the_keystone_executable_exits_with_the_command_s_code(tmp_path: Path) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text("version: 1\nid: broken\n", encoding="utf-8")
    done = run_keystone("validate", str(spec), env=embedded_env(tmp_path / "home"), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "broken.yaml" in done.stderr


def test_a_run_with_a_judge_prints_no_log_lines(tmp_path: Path) -> None:
    """Issue 18, "no log noise": refund-agent.yaml's LLM judge (the scripted provider) makes
    HTTP calls through the openai SDK, whose client logged each one at INFO on stderr."""
    done = run_keystone(
        "run",
        "examples/specs/refund-agent.yaml",
        env=embedded_env(tmp_path / "home", KEYSTONE_POLICY_MIN_BACKEND="local"),
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # a verdict, not an error
    assert "judge" in done.stdout  # the judge did run
    logged = [line for line in done.stderr.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert logged == [], "\n".join(logged)


@pytest.mark.parametrize("entry_point", ["keystone_web.wsgi", "keystone_web.asgi"])
def test_a_web_server_loads_every_view_and_freezes_them_before_its_first_request(
    tmp_path: Path, entry_point: str
) -> None:
    """keystone_web.serving.app_loaded: the views are imported at start-up instead of in the
    first request, and a full collection during a request no longer goes over the app."""
    code = (
        "import gc, json, sys\n"
        f"import {entry_point}\n"
        "print(json.dumps(['evaluations.views.runs' in sys.modules, gc.get_freeze_count()]))"
    )
    views_loaded, frozen = _json_printed_by(code, embedded_env(tmp_path / "home"), timeout=60)
    assert views_loaded is True
    assert frozen > 10_000


@pytest.mark.parametrize("broker", [False, True], ids=["embedded", "broker"])
def test_a_web_server_with_a_broker_loads_celery_s_client_before_its_first_request(
    tmp_path: Path, broker: bool
) -> None:
    """The first run a request starts sends its message through Celery's client: loaded with
    the app (keystone_web.serving.app_loaded), kombu's transport for the broker included, and
    without connecting to the broker (none listens at this address). A server on the embedded
    default, which sends no messages, loads none of it."""
    code = (
        "import json, sys\n"
        "import keystone_web.wsgi\n"
        "print(json.dumps([m in sys.modules for m in ('celery', 'evaluations.tasks', "
        "'kombu.transport.redis')]))"
    )
    extra = {"CELERY_BROKER_URL": "redis://127.0.0.1:9/0"} if broker else {}
    loaded = _json_printed_by(code, embedded_env(tmp_path / "home", **extra), timeout=60)
    assert loaded == [broker] * 3


@pytest.mark.parametrize(
    ("spec", "proxy"),
    [
        ({"agent": {"type": "command"}}, False),
        ({"agent": {"type": "python"}}, False),  # no tools: nothing to wrap
        ({"agent": {"type": "python", "tools": ["m:f"]}}, True),
        ({"agent": {"type": "python", "tool_registry": "m:TOOLS"}}, True),
        ({"agent": {"type": "command"}, "tools": [{"name": "t"}]}, True),
        ({"agent": {"type": "command"}, "replay": {"sessions": []}}, True),
    ],
)
def test_the_pre_fork_import_and_an_execution_share_one_tool_proxy_rule(
    spec: dict[str, Any], proxy: bool
) -> None:
    """execution_modules_import asks the harness's own rule (tool_proxy_wanted), which
    _world starts the proxy by: a replaying execution of a spec with replay sessions."""
    from evaluations.runner.harness import tool_proxy_wanted

    assert tool_proxy_wanted(spec, replaying=bool(spec.get("replay"))) is proxy
