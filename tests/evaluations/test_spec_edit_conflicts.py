"""Two people editing one spec version in the browser: the second to save used to become the
latest version silently, undoing the first one's changes (still in the history, but no longer
what runs). Now the second is told which version was saved meanwhile and by whom, keeps the
text typed, and a second save, taken knowing it, goes through."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role, SpecVersion

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: edited
task: {{prompt: "{prompt}"}}
agent: {{type: command, command: "echo hello"}}
invariants:
  greets: {{description: d, check: {{type: contains, value: hello}}}}
"""
URL = "/p/demo/specs/edited/edit/"


def _editor(project: Project, django_user_model: Any, username: str) -> Client:
    user = django_user_model.objects.create_user(username=username, password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    client = Client()
    client.force_login(user)
    return client


def _base(page: str) -> str:
    """The version the editor's form says its text was edited from."""
    match = re.search(r'name="base" value="(\d+)"', page)
    assert match is not None, "the editor form carries no base version"
    return match.group(1)


def _prompts() -> list[tuple[int, str]]:
    return [
        (v.number, v.parsed["task"]["prompt"])
        for v in SpecVersion.objects.filter(spec__slug="edited").order_by("number")
    ]


@pytest.mark.embedded
def test_the_second_of_two_edits_of_one_version_is_refused_then_saved_knowingly(
    project: Project, django_user_model: Any
) -> None:
    services.spec_version_create(project=project, source_yaml=SPEC.format(prompt="v1"))
    alice = _editor(project, django_user_model, "alice")
    bob = _editor(project, django_user_model, "bob")
    # Both open the editor on version 1.
    alice_base = _base(alice.get(URL).content.decode())
    bob_base = _base(bob.get(URL).content.decode())
    assert alice_base == bob_base == "1"

    saved = alice.post(URL, {"source": SPEC.format(prompt="alice"), "base": alice_base})
    assert saved.status_code == 302
    bobs_text = SPEC.format(prompt="bob")
    refused = bob.post(URL, {"source": bobs_text, "base": bob_base})
    assert refused.status_code == 422
    page = refused.content.decode()
    assert "version 2 of edited was saved by alice after you opened version 1" in page
    assert "bob" in page and "prompt: &quot;bob&quot;" in page  # bob's text is still there
    assert _prompts() == [(1, "v1"), (2, "alice")]  # alice's version is still the latest

    # Bob has seen it; the page now says it edits from version 2, and saving keeps his text.
    assert _base(page) == "2"
    again = bob.post(URL, {"source": bobs_text, "base": _base(page)})
    assert again.status_code == 302
    assert _prompts() == [(1, "v1"), (2, "alice"), (3, "bob")]


@pytest.mark.embedded
def test_saving_the_text_of_the_newer_version_is_no_conflict(
    project: Project, django_user_model: Any
) -> None:
    services.spec_version_create(project=project, source_yaml=SPEC.format(prompt="v1"))
    services.spec_version_create(project=project, source_yaml=SPEC.format(prompt="same"))
    bob = _editor(project, django_user_model, "bob")
    response = bob.post(URL, {"source": SPEC.format(prompt="same"), "base": "1"})
    assert response.status_code == 302
    assert _prompts() == [(1, "v1"), (2, "same")]


@pytest.mark.django_db(transaction=True)
def test_two_saves_of_one_version_at_once_make_one_version(
    project: Project, django_user_model: Any
) -> None:
    """Checked under the spec's lock, not before it: of two saves racing, one is refused
    (PostgreSQL: two connections writing at once)."""
    services.spec_version_create(project=project, source_yaml=SPEC.format(prompt="v1"))
    statuses: list[int] = []
    barrier = threading.Barrier(2)

    def save(client: Client, prompt: str) -> None:
        try:
            barrier.wait()
            response = client.post(URL, {"source": SPEC.format(prompt=prompt), "base": "1"})
            statuses.append(response.status_code)
        finally:
            connection.close()

    clients = [_editor(project, django_user_model, name) for name in ("alice", "bob")]
    threads = [
        threading.Thread(target=save, args=(client, name))
        for client, name in zip(clients, ("alice", "bob"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [302, 422]
    assert len(_prompts()) == 2
