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


def _file_spec_and_its_editor(tmp_path: Path, django_user_model: Any) -> tuple[Any, Client]:
    """Version 1 of `from-files` read from tmp_path/specs (its agent in ../agents/shell), and
    a browser logged in as an editor of its project."""
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
        read_from_files=True,
    )
    editor = django_user_model.objects.create_user(username="ed", password="pw-ed-12345")
    Membership.objects.create(project=project, user=editor, role=Role.EDITOR)
    client = Client()
    client.force_login(editor)
    return v1, client


def test_a_spec_from_files_edited_in_the_browser_still_resolves_its_paths(
    tmp_path: Path, django_user_model: Any
) -> None:
    v1, client = _file_spec_and_its_editor(tmp_path, django_user_model)
    specs = tmp_path / "specs"
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


def test_a_browser_edit_cannot_add_a_host_command_or_another_server_path(
    tmp_path: Path, django_user_model: Any
) -> None:
    """The directory a file-read spec keeps gives its edited versions what the operator's file
    had, no more: an editor who adds agent.start (a command on the Keystone host, outside any
    sandbox) or points sandbox.workspace elsewhere on the server gets a confined run."""
    v1, client = _file_spec_and_its_editor(tmp_path, django_user_model)
    (tmp_path / "server-secrets").mkdir()
    (tmp_path / "server-secrets" / "agent.sh").write_text("echo read-the-servers-files\n")
    edit_url = reverse("spec_edit", args=["p", "from-files"])
    marker = tmp_path / "ran-on-the-host"

    def edited_run(source: str) -> Execution:
        response = client.post(edit_url, {"spec": "from-files", "source": source})
        assert response.status_code == 302, response.content
        version = v1.spec.latest_version()
        run = execute_run(
            services.run_create(spec_version=version, trigger=Trigger.WEB, enqueue=False)
        )
        return Execution.objects.get(run=run)

    host_command = SPEC.format(description="2").replace(", workspace: ../agents/shell", "")
    host_command = host_command.replace(
        'agent: {type: command, command: "sh agent.sh"}',
        "agent: {type: http, endpoint: 'http://127.0.0.1:9/x', start: "
        f"{{command: 'touch {marker}', ready_url: 'http://127.0.0.1:9/'}}}}",
    )
    assert "start:" in host_command
    started = edited_run(host_command)
    assert started.status == "error" and "agent.start runs a command" in started.error
    assert not marker.exists(), "the edited spec ran its command on the host"

    elsewhere = edited_run(
        SPEC.format(description="3").replace("../agents/shell", "../server-secrets")
    )
    assert elsewhere.status == "error", elsewhere.final_output
    assert "read-the-servers-files" not in elsewhere.final_output

    kept = edited_run(SPEC.format(description="4"))  # the file's own paths: runs as before
    assert kept.status == "success", kept.error
    assert "agent-in-workspace" in kept.final_output
