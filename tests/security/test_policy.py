"""Issue 13, items 4 and 7: a spec cannot decide its own privileges. Each test is the
attempt: a weaker sandbox, the server's secrets, a limit nobody would allow, 100,000
executions from one call. Each is refused at upload (422 from the API) and, when the policy
tightened after the upload, again when the execution starts; each refusal names the setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from checks.spec import SpecValidationError
from evaluations import services
from evaluations.models import ExecutionStatus, Membership, Project, Role, Run
from tests.evaluations.execution_helpers import execute_run

BASE = """\
version: 1
id: greedy
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


def _refusal(project: Project, extra: str) -> str:
    with pytest.raises(SpecValidationError) as refused:
        services.spec_version_create(project=project, source_yaml=BASE + extra)
    return str(refused.value)


@pytest.mark.django_db
def test_a_weaker_sandbox_than_the_floor_is_refused(project: Project, settings: Any) -> None:
    settings.KEYSTONE_POLICY_MIN_BACKEND = "bwrap"
    message = _refusal(project, "sandbox: {backend: local}\n")
    assert "sandbox.backend" in message and "KEYSTONE_POLICY_MIN_BACKEND" in message
    services.spec_version_create(project=project, source_yaml=BASE + "sandbox: {backend: bwrap}\n")


@pytest.mark.django_db
def test_the_servers_own_settings_are_never_secrets(project: Project, settings: Any) -> None:
    settings.KEYSTONE_POLICY_ALLOWED_SECRETS = ["SECRET_KEY"]  # not even when listed
    message = _refusal(project, "secrets: [SECRET_KEY, DATABASE_URL, KEYSTONE_POSTGRES_URL]\n")
    for index in range(3):
        assert f"secrets[{index}]" in message
    assert "server's own settings" in message


@pytest.mark.django_db
def test_an_allow_list_of_secrets_is_enforced(project: Project, settings: Any) -> None:
    settings.KEYSTONE_POLICY_ALLOWED_SECRETS = ["REFUND_API_TOKEN"]
    message = _refusal(project, "secrets: [STRIPE_LIVE_KEY]\n")
    assert "KEYSTONE_POLICY_ALLOWED_SECRETS" in message
    services.spec_version_create(
        project=project, source_yaml=BASE + "secrets: [REFUND_API_TOKEN]\n"
    )


@pytest.mark.django_db
def test_the_hosts_network_is_refused_unless_the_operator_allows_it(
    project: Project, settings: Any
) -> None:
    message = _refusal(project, "sandbox: {network: host}\n")
    assert "sandbox.network" in message and "KEYSTONE_POLICY_ALLOW_HOST_NETWORK" in message
    settings.KEYSTONE_POLICY_ALLOW_HOST_NETWORK = True
    services.spec_version_create(project=project, source_yaml=BASE + "sandbox: {network: host}\n")


@pytest.mark.django_db
def test_limits_nobody_would_allow_are_refused(project: Project) -> None:
    message = _refusal(
        project, "sandbox:\n  resources: {max_output_bytes: 4000000000, memory_mb: 1000000}\n"
    )
    assert "sandbox.resources.max_output_bytes" in message
    assert "KEYSTONE_POLICY_MAX_OUTPUT_BYTES" in message
    assert "KEYSTONE_POLICY_MAX_MEMORY_MB" in message


@pytest.mark.django_db
def test_a_disk_limit_above_the_ceiling_is_refused(project: Project, settings: Any) -> None:
    settings.KEYSTONE_POLICY_MAX_DISK_MB = 500
    message = _refusal(project, "sandbox:\n  resources: {disk_mb: 1000000}\n")
    assert "sandbox.resources.disk_mb" in message
    assert "1e+06 is above this server's ceiling of 500" in message
    assert "KEYSTONE_POLICY_MAX_DISK_MB" in message


@pytest.mark.django_db
def test_an_unbounded_plan_is_refused_with_its_size_and_the_limit(
    project: Project, django_user_model: Any, settings: Any
) -> None:
    settings.KEYSTONE_POLICY_MAX_EXECUTIONS = 1000
    user = django_user_model.objects.create_user(username="ci", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    prompts = json.dumps([f"p{i}" for i in range(1000)])
    services.spec_version_create(
        project=project, source_yaml=BASE.replace('{prompt: "p"}', f"{{prompts: {prompts}}}")
    )
    response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        f"/api/projects/{project.slug}/specs/greedy/runs",
        json.dumps({"replicas": 100}),
        content_type="application/json",
    )
    assert response.status_code == 422, response.content
    text = response.content.decode()
    assert "100000 executions" in text and "1000 per run" in text
    assert "KEYSTONE_POLICY_MAX_EXECUTIONS" in text
    assert Run.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_policy_tightened_after_the_upload_refuses_the_execution(
    project: Project, tmp_path: Path, settings: Any
) -> None:
    marker = tmp_path / "agent-ran"
    source = BASE.replace('"echo hi"', f'"touch {marker}; echo hi"') + "secrets: [PARTNER_TOKEN]\n"
    version = services.spec_version_create(project=project, source_yaml=source)
    settings.KEYSTONE_POLICY_ALLOWED_SECRETS = []  # the operator revoked every secret
    run = execute_run(
        services.run_create(spec_version=version, spec_dir=str(tmp_path), enqueue=False)
    )
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert execution.error.startswith("refused by the server's policy: secrets[0]")
    assert not marker.exists()  # the agent never ran
    assert any("KEYSTONE_POLICY_ALLOWED_SECRETS" in w for w in run.warnings)


@pytest.mark.django_db
def test_the_settings_page_shows_the_policy(project: Project, django_user_model: Any) -> None:
    admin = django_user_model.objects.create_user(username="admin", password="pw-123456")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    client = Client()
    client.force_login(admin)
    html = client.get(f"/p/{project.slug}/settings/").content.decode()
    assert 'id="server-policy"' in html
    assert "KEYSTONE_POLICY_MIN_BACKEND" in html and "KEYSTONE_POLICY_MAX_EXECUTIONS" in html


def test_keystone_run_refused_by_the_policy_exits_2_naming_the_setting(tmp_path: Path) -> None:
    from tests.cli_helpers import embedded_env, run_keystone

    spec = tmp_path / "local.yaml"
    spec.write_text(BASE + "sandbox: {backend: local}\n")
    env = embedded_env(tmp_path / "home", KEYSTONE_POLICY_MIN_BACKEND="bwrap")
    done = run_keystone("run", str(spec), env=env)
    assert done.returncode == 2, done.stderr
    assert "KEYSTONE_POLICY_MIN_BACKEND" in done.stderr and "nothing was run" in done.stderr
