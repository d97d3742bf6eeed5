"""Issue 13, items 5 and 9: a spec written to crash or stall the server is refused with an
error that says why (422 from the API, exit 2 from the CLI), and the process lives on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from checks.spec import validate_spec_text
from evaluations import services
from evaluations.models import Membership, Project, Role

ROOT = Path(__file__).resolve().parents[2]

BOMBS = {
    "flow brackets (60 KB)": "[" * 60_000,
    "closed flow brackets": "[" * 30_000 + "]" * 30_000,
    "nested mappings": "{a: " * 20_000 + "1" + "}" * 20_000,
    "block nesting": "".join("  " * i + "- \n" for i in range(600)),
}


@pytest.mark.parametrize("text", BOMBS.values(), ids=BOMBS.keys())
def test_deep_nesting_is_refused_before_parsing(text: str) -> None:
    data, errors = validate_spec_text(text, source="bomb.yaml")
    assert data is None
    assert len(errors) == 1 and "nested too deeply" in errors[0].message


def test_a_five_megabyte_spec_is_refused_naming_the_limit() -> None:
    text = "version: 1\n# " + "x" * 5_000_000 + "\n"
    data, errors = validate_spec_text(text, source="big.yaml")
    assert data is None
    assert errors[0].message == "the spec is 5,000,014 bytes; the limit is 1,000,000 bytes"


def test_a_bomb_through_the_cli_exits_2_with_the_reason(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMBS["flow brackets (60 KB)"])
    done = subprocess.run(
        [sys.executable, "-m", "evaluations.cli", "validate", str(bomb)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "nested too deeply" in done.stderr


@pytest.mark.django_db
def test_a_bomb_through_the_api_is_422_and_the_server_answers_after(
    django_user_model: Any,
) -> None:
    project = Project.objects.create(name="Mine", slug="mine")
    user = django_user_model.objects.create_user(username="editor", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(
        "/api/projects/mine/specs",
        json.dumps({"source_yaml": BOMBS["flow brackets (60 KB)"]}),
        content_type="application/json",
    )
    assert response.status_code == 422
    assert "nested too deeply" in response.content.decode()
    assert client.get("/api/health").status_code == 200
