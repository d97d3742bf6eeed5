"""A spec read from files (the CLI, the demo) and then edited in the browser keeps its
directory: its relative paths (`sandbox.workspace: ../agents/...`) still resolve, and the
new version runs as the old one did (issue 17: every execution of an edited demo spec
errored while the editor said "Valid")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evaluations import services
from evaluations.models import Execution, Membership, Project, Role, Trigger
from tests.evaluations.execution_helpers import execute_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: from-files
description: "{description}"
task: {{prompt: "go"}}
agent: {{type: command, command: "sh agent.sh"}}
sandbox: {{backend: local, workspace: ../agents/shell}}
invariants:
  answers: {{description: answers, check: {{type: contains, value: agent-in-workspace}}}}
"""


def test_a_spec_from_files_edited_in_the_browser_still_resolves_its_paths(
    tmp_path: Path, django_user_model: Any
) -> None:
    agent = tmp_path / "agents" / "shell"
    agent.mkdir(parents=True)
    (agent / "agent.sh").write_text("echo agent-in-workspace\n")
    specs = tmp_path / "specs"
    specs.mkdir()
    project = Project.objects.create(name="P", slug="p")
    v1 = services.spec_version_create(
        project=project,
        source_yaml=SPEC.format(description="first"),
        source_name=str(specs / "from-files.yaml"),
        base_dir=str(specs),
    )
    editor = django_user_model.objects.create_user(username="ed", password="pw-ed-12345")
    Membership.objects.create(project=project, user=editor, role=Role.EDITOR)
    client = Client()
    client.force_login(editor)
    edit_url = reverse("spec_edit", args=["p", "from-files"])

    page = client.get(edit_url).content.decode()
    assert f"resolve in <code>{specs}</code>" in page  # the editor says where

    response = client.post(edit_url, {"spec": "from-files", "source": SPEC.format(description="2")})
    assert response.status_code == 302, response.content
    v2 = v1.spec.versions.get(number=2)
    assert v2.base_dir == str(specs)

    run = execute_run(services.run_create(spec_version=v2, trigger=Trigger.WEB, enqueue=False))
    execution = Execution.objects.get(run=run)
    assert execution.status == "success", execution.error
    assert "agent-in-workspace" in execution.final_output
