"""Issue 16, item 6: the CI examples docs/ci.md points to load as YAML, have the shape their
CI system needs, and every `keystone` command they run parses with the real command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from evaluations.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / "examples/ci/github-actions.yml"
GITLAB = ROOT / "examples/ci/gitlab-ci.yml"


def _keystone_commands(scripts: list[str]) -> list[list[str]]:
    """Each `keystone ...` line of the scripts as argv, CI expressions replaced by a word."""
    commands = []
    for script in scripts:
        text = re.sub(r"\$\{\{[^}]*\}\}", "x", script)  # GitHub's ${{ ... }}
        text = text.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("keystone "):
                commands.append(shlex.split(line)[1:])
    return commands


def _parses(argv: list[str]) -> Any:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`keystone {' '.join(argv)}` does not parse")
    assert getattr(args, "handler", None) is not None, argv
    return args


def _check_runs(commands: list[list[str]]) -> list[Any]:
    assert commands, "no keystone command found"
    runs = [_parses(argv) for argv in commands if argv[0] == "run"]
    for argv in commands:
        _parses(argv)
    assert runs, "no keystone run"
    for args in runs:
        assert args.junit and args.markdown, "each run writes the JUnit and Markdown reports"
    return runs


def test_github_workflow() -> None:
    workflow = yaml.safe_load(GITHUB.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads `on` as true
    assert "pull_request" in triggers
    jobs = workflow["jobs"]
    assert set(jobs) == {"local", "remote"}
    for name, job in jobs.items():
        steps = job["steps"]
        assert all(("run" in step) != ("uses" in step) for step in steps), name
        runs = _check_runs(_keystone_commands([step["run"] for step in steps if "run" in step]))
        published = " ".join(str(step.get("with", {}).get("report_paths", "")) for step in steps)
        commented = " ".join(step.get("run", "") for step in steps)
        for args in runs:
            assert args.junit in published, f"{name}: {args.junit} is not published"
            assert f"--body-file {args.markdown}" in commented, f"{name}: no PR comment"
        always = [s for s in steps if "report_paths" in s.get("with", {})]
        assert always and all(s.get("if", "").startswith("always()") for s in always)
    remote = jobs["remote"]["env"]
    assert {"KEYSTONE_URL", "KEYSTONE_TOKEN"} <= set(remote)
    assert "secrets." in remote["KEYSTONE_TOKEN"]


def test_gitlab_jobs() -> None:
    config = yaml.safe_load(GITLAB.read_text())
    template = config[".keystone"]
    assert template["artifacts"]["when"] == "always"
    junit = template["artifacts"]["reports"]["junit"]
    notes = "\n".join(template["after_script"])
    assert "merge_requests/$CI_MERGE_REQUEST_IID/notes" in notes
    jobs = {
        name: job for name, job in config.items() if not name.startswith(".") and name != "stages"
    }
    assert set(jobs) == {"keystone:local", "keystone:remote"}
    for name, job in jobs.items():
        assert (
            job["extends"] == ".keystone"
            and job.get("stage", template["stage"]) in config["stages"]
        )
        runs = _check_runs(_keystone_commands(job["script"]))
        for args in runs:
            assert args.junit == junit, name
            assert args.markdown in notes, name
    assert "KEYSTONE_URL" in jobs["keystone:remote"]["variables"]


def test_docs_point_to_both_files() -> None:
    text = (ROOT / "docs/ci.md").read_text()
    assert "examples/ci/github-actions.yml" in text and "examples/ci/gitlab-ci.yml" in text
