"""A spec typed in the browser has no directory on the server. Its relative files must not
resolve in the server's own state (KEYSTONE_HOME holds the database and the artifacts), and
`sandbox.workspace` may not copy server directories into the agent's reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from evaluations import services
from evaluations.models import Execution, Project, Trigger
from tests.evaluations.execution_helpers import execute_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: {spec_id}
task: {{prompt: "list"}}
agent: {{type: command, command: "sh -c 'ls -a; cat secret.txt 2>/dev/null; true'"}}
sandbox: {{backend: local{workspace}}}
{services}invariants:
  answers: {{description: answers, check: {{type: not_contains, value: TOP-SECRET}}}}
{replay}"""


def _web_run(project: Project, **parts: str) -> Any:
    values = {"spec_id": "typed", "workspace": "", "services": "", "replay": ""} | parts
    version = services.spec_version_create(project=project, source_yaml=SPEC.format(**values))
    assert version.base_dir == ""  # typed, not read from a file
    run = services.run_create(spec_version=version, trigger=Trigger.WEB, enqueue=False)
    return execute_run(run)


@pytest.fixture
def server_secret() -> Path:
    """A file in the server's state directory that no spec may reach."""
    home = Path(settings.KEYSTONE_HOME)
    home.mkdir(parents=True, exist_ok=True)
    secret = home / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    return secret


def test_workspace_outside_the_missing_directory_is_refused(server_secret: Path) -> None:
    project = Project.objects.create(name="P", slug="p")
    relative_home = Path("..") / ".." / ".." / server_secret.parent.relative_to("/")
    run = _web_run(project, workspace=f", workspace: {relative_home}")
    execution = Execution.objects.get(run=run)
    assert execution.status == "error"
    assert "sandbox.workspace" in execution.error and "leaves" in execution.error
    assert "TOP-SECRET" not in execution.final_output


def test_seed_files_resolve_in_an_empty_stand_in_not_in_keystone_home(
    server_secret: Path,
) -> None:
    project = Project.objects.create(name="P", slug="p")
    services_block = "services:\n  - {name: db, type: sqlite, seed: secret.txt}\n"
    # The service cannot start (no such seed where a typed spec's files are looked up); the
    # worker path treats that as an error to retry, the in-process path raises it.
    with pytest.raises(services.InfrastructureError, match="not found in .*spec-without-directory"):
        _web_run(project, services=services_block)


def test_replay_files_are_refused_with_a_warning(server_secret: Path) -> None:
    project = Project.objects.create(name="P", slug="p")
    run = _web_run(project, replay=f"replay:\n  sessions: [{{file: {server_secret}}}]\n")
    assert not Execution.objects.filter(run=run, pillar="replay").exists()
    assert any("replay file needs a spec read from a directory" in w for w in run.warnings)


def test_the_same_spec_from_a_file_may_use_its_directory(tmp_path: Path) -> None:
    """The operator's spec file may name siblings: that is the CLI's and the demo's case."""
    project = Project.objects.create(name="P", slug="p")
    fixture = tmp_path / "fixture"
    fixture.mkdir()
    (fixture / "secret.txt").write_text("visible on purpose\n")
    specs = tmp_path / "specs"
    specs.mkdir()
    source = SPEC.format(
        spec_id="from-file", workspace=", workspace: ../fixture", services="", replay=""
    )
    version = services.spec_version_create(
        project=project, source_yaml=source, base_dir=str(specs), read_from_files=True
    )
    run = execute_run(services.run_create(spec_version=version, enqueue=False))
    execution = Execution.objects.get(run=run)
    assert execution.status == "success", execution.error
    assert "visible on purpose" in execution.final_output
