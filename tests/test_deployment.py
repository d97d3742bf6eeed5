"""The scaled-out deployment runs exactly one beat (issue 20, item 1): without one, the
executions of a worker that died are never re-queued and its run waits forever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from evaluations import cli_commands
from evaluations.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _services() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def _runs_beat(command: list[str]) -> bool:
    return "beat" in command[:3] or "--beat" in command or "-B" in command


def test_compose_runs_exactly_one_beat_and_workers_without_it() -> None:
    services = _services()
    beats = [name for name, s in services.items() if _runs_beat(list(s.get("command") or []))]
    assert beats == ["beat"]
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1
    assert not _runs_beat(services["worker"]["command"])


def test_keystone_worker_runs_beat_only_when_asked_with_a_unique_name(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = False
    started: list[list[str]] = []
    # Capture the command the worker replaces itself with, instead of becoming Celery.
    monkeypatch.setattr(cli_commands.os, "execv", lambda path, argv: started.append(argv))
    monkeypatch.setattr(cli_commands, "setup_django", lambda migrate=True: None)
    parser = build_parser()
    cli_commands.cmd_worker(parser.parse_args(["worker"]))
    cli_commands.cmd_worker(parser.parse_args(["worker", "--beat"]))
    plain, with_beat = started
    assert "--beat" not in plain and "--beat" in with_beat
    name = plain[plain.index("--hostname") + 1]
    assert name.startswith("keystone-") and name.endswith("@%h") and name != "keystone@%h"


def test_keystone_worker_refuses_an_unknown_log_level_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused by `keystone worker` itself, before it replaces itself with the Celery worker
    (keystone_web/worker.py), whatever the case it is written in."""
    parser = build_parser()
    assert parser.parse_args(["worker", "--loglevel", "WARNING"]).loglevel == "warning"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["worker", "--loglevel", "verbose"])
    assert exited.value.code == 2
    assert "argument --loglevel: invalid choice: 'verbose'" in capsys.readouterr().err
