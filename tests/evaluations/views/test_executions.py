"""Execution pages and artifact downloads: the transcript with faults, output streams,
workspace diff, HTTP mock requests, database writes, check results of every source,
forbidden violations, the reproducer command (run for real through `keystone run`),
large artifacts read with a cap, permissions across two projects, and query counts.

The executions shown come from a run of run_data.DASH_SPEC executed for real once per
module; large artifacts and query counts use synthetic rows.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shlex
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import selectors, services
from evaluations.cli import build_parser
from evaluations.cli_commands import cli_selection
from evaluations.models import (
    Artifact,
    ArtifactKind,
    CheckResult,
    Execution,
    ResultSource,
    Run,
    RunStatus,
)
from tests.cli_helpers import embedded_env, run_keystone

from .run_data import World, real_world, storage_settings, synthetic_run, synthetic_version

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def world(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[World]:
    with django_db_blocker.unblock(), real_world(tmp_path_factory.mktemp("ex"), "dashexec") as w:
        yield w


@pytest.fixture(autouse=True)
def _world_storage(world: World, settings: Any) -> None:
    for name, value in storage_settings(world.artifact_root).items():
        setattr(settings, name, value)


def htmx(client: Client, url: str) -> Any:
    return client.get(url, HTTP_HX_REQUEST="true")


def execution(world: World, scenario: str, prompt_index: int = 0, replica: int = 0) -> Execution:
    return Execution.objects.get(
        run=world.run, scenario=scenario, prompt_index=prompt_index, replica=replica
    )


def page_url(world: World, execution_id: int, project: str | None = None) -> str:
    return reverse("execution_detail", args=[project or world.mine.slug, execution_id])


def download_url(world: World, execution_id: int, artifact_id: int) -> str:
    return reverse("artifact_download", args=[world.mine.slug, execution_id, artifact_id])


def section(html: str, title_id: str) -> str:
    start = html.index(f'id="{title_id}"')
    return html[start : html.index("</section>", start)]


# --- The page -----------------------------------------------------------------------------


def test_execution_page_shows_what_the_agent_did(world: World) -> None:
    target = execution(world, "no-chaos")
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    # Transcript: LLM call, the tool call it asked for (through the proxy), LLM call.
    transcript = section(html, "transcript-title")
    steps = re.findall(r'<li class="step step-(llm|tool)', transcript)
    assert steps == ["llm", "tool", "llm"]
    assert "LLM call 1" in transcript and "LLM call 2" in transcript
    assert "scripted-dash" in transcript
    assert "asks for: <code>orders({&quot;order_id&quot;: 7})</code>" in transcript
    # The call carries the model's arguments; the REST request it became is shown beside them.
    assert "arguments: <code>{&quot;order_id&quot;: 7}</code>" in transcript
    assert "sent as <code>GET /orders/7</code>" in transcript
    assert "as the model asked" in transcript
    assert "&quot;shipped&quot;" in transcript  # the tool's answer
    assert re.search(r"\d+ in · \d+ out · \$[\d.]+ · \d+ ms", transcript)
    assert " fault" not in re.sub(r"fault: ", "", transcript.split("<ol")[1].split(">")[0])
    # Output streams.
    streams = html[html.index('aria-label="Output streams"') :]
    assert "hello, the order tool said: {&quot;id&quot;: 7" in streams
    assert "agent: 3 messages" in streams
    # Workspace diff, HTTP mock requests, database writes.
    diff = section(html, "diff-title")
    assert "added" in diff and "note.txt" in diff and "looked up order 7" in diff
    http = section(html, "http-title")
    assert "orders" in http and "GET /orders/7" in http and ">200<" in http
    db_writes = section(html, "db-title")
    assert "audit" in db_writes and "events" in db_writes and "inserted" in db_writes
    # Check results, labelled by source.
    results = section(html, "results-title")
    for invariant in ("greets", "says_shipped", "note_written"):
        assert invariant in results
    assert results.count('class="source source-engine">Engine') == 3
    assert 'title="a gate: failing it forces composite 0">gate' in results  # greets
    # The reproducer.
    assert (
        "keystone run dash-agent.yaml --scenario no-chaos --prompt-index 0 --replica 0 --seed 42"
        in html
    )
    # Artifacts, each with a download link.
    for artifact in Artifact.objects.filter(execution=target):
        assert f'href="{download_url(world, target.pk, artifact.pk)}"' in html


def test_execution_page_highlights_the_injected_fault_and_the_failure(world: World) -> None:
    target = execution(world, "orders-down", 1, 1)
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    transcript = section(html, "transcript-title")
    tool_step = re.search(r'<li class="step step-tool fault">(.*?)</li>', transcript, re.S)
    assert tool_step, transcript
    assert "fault: error" in tool_step.group(1)
    assert ">503<" in tool_step.group(1)
    results = section(html, "results-title")
    assert re.search(r'class="result-fail">\s*<td class="mono">says_shipped', results)
    assert "CONTAINS_FAILED" in results
    assert "No request reached an HTTP mock" in html  # the fault answered, not the mock
    assert "--scenario orders-down --prompt-index 1 --replica 1 --seed 42" in html


def test_each_llm_call_lists_every_message_it_was_sent_collapsed(world: World) -> None:
    target = execution(world, "no-chaos")
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()
    transcript = section(html, "transcript-title")
    lists = re.findall(r'<details class="llm-messages">(.*?)</details>', transcript, re.S)
    assert len(lists) == 2  # one per LLM call, closed until opened
    assert "All 1 message sent to the model" in lists[0]
    # The second call was sent the whole conversation: the prompt, the model's tool request
    # and the tool's answer, each with its role.
    second = lists[1]
    assert "All 3 messages sent to the model" in second
    roles = re.findall(r'<span class="message-role">(\w+)</span>', second)
    assert roles == ["user", "assistant", "tool"]
    assert "asks orders(" in second and "answers " in second
    assert "&quot;shipped&quot;" in second  # the tool result, not only the last message


def test_the_timeline_places_every_call_with_its_duration(world: World) -> None:
    target = execution(world, "no-chaos")
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()
    timeline = section(html, "timeline-title")
    rows = re.findall(r'<tr class="timeline-(llm|tool|http)( timeline-fault)?">', timeline)
    kinds = [kind for kind, _ in rows]
    # The agent asks the model, calls the tool (which reaches the HTTP mock), asks again.
    assert kinds[0] == "llm" and kinds[-1] == "llm"
    assert sorted(kinds) == ["http", "llm", "llm", "tool"]
    starts = [float(x) for x in re.findall(r'<td class="num">\+(\d+) ms</td>', timeline)]
    assert starts == sorted(starts)  # in time order, from the execution's start
    assert all(ms >= 0 for ms in starts)
    assert re.search(r'class="timeline-bar" style="left: [\d.]+%; width: [\d.]+%"', timeline)

    faulted = execution(world, "orders-down", 1, 1)
    html = world.client("viewer").get(page_url(world, faulted.pk)).content.decode()
    timeline = section(html, "timeline-title")
    fault_row = re.search(r'<tr class="timeline-tool timeline-fault">(.*?)</tr>', timeline, re.S)
    assert fault_row and "fault: error" in fault_row.group(1)


def test_execution_htmx_answers_the_body_and_links_its_neighbours(world: World) -> None:
    ids = list(Execution.objects.filter(run=world.run).order_by("id").values_list("id", flat=True))
    client = world.client("viewer")

    first = htmx(client, page_url(world, ids[0]))
    middle = client.get(page_url(world, ids[3])).content.decode()

    body = first.content.decode()
    assert first.status_code == 200
    assert body.lstrip().startswith('<div id="execution-body">')
    assert "<html" not in body
    assert 'rel="prev"' not in body
    assert f'hx-get="{page_url(world, ids[1])}" hx-target="#execution-body"' in body
    assert f'href="{page_url(world, ids[2])}"' in middle and 'rel="prev"' in middle
    assert f'href="{page_url(world, ids[4])}"' in middle


def test_judge_and_human_results_are_labelled_and_overrides_marked(world: World) -> None:
    target = execution(world, "orders-down")
    engine = CheckResult.objects.get(execution=target, invariant_id="says_shipped")
    for source, passed in ((ResultSource.JUDGE, False), (ResultSource.HUMAN, True)):
        CheckResult.objects.create(
            execution=target,
            run=world.run,
            invariant_id="says_shipped",
            check_type=engine.check_type,
            score=1.0 if passed else 0.2,
            passed=passed,
            failure_code="" if passed else "JUDGE_BELOW_THRESHOLD",
            message=f"{source} says so",
            details={"reason": f"graded by {source}"},
            source=source,
        )

    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    results = section(html, "results-title")
    rows = re.findall(
        r"<tr class=\"([^\"]*)\">\s*<td class=\"mono\">says_shipped.*?</tr>", results, re.S
    )
    assert rows == ["result-fail overridden", "result-fail overridden", ""]
    assert 'class="source source-judge">Judge' in results
    assert 'class="source source-human">Human' in results
    assert "JUDGE_BELOW_THRESHOLD" in results and "human says so" in results
    assert "graded by judge" in results  # details, pretty-printed


def test_forbidden_violations_are_listed(world: World) -> None:
    target = execution(world, "no-chaos", 1, 0)
    Execution.objects.filter(pk=target.pk).update(
        forbidden_violations=[{"rule": "http_except", "service": "payments", "path": "/charge"}]
    )

    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    forbidden = section(html, "forbidden-title")
    assert "forces this execution's composite to 0" in forbidden
    assert "http_except" in forbidden and "/charge" in forbidden


def test_transcript_pairs_the_models_tool_requests_with_the_proxied_calls() -> None:
    trace = {
        "llm_calls": [
            {
                "model": "m",
                "status": 200,
                "response": {"choices": [{"message": {"content": None, "tool_calls": [1]}}]},
                "tool_calls": [
                    {"name": "lookup", "arguments": {"id": 1}, "source": "model"},
                    {"name": "never_called", "arguments": {}, "source": "model"},
                ],
            },
            {"model": "m", "status": 429, "fault": "rate_limit", "response": {"error": "slow"}},
        ],
        "tool_calls": [
            {"name": "warmup", "status": 200},
            {"name": "lookup", "arguments": {}, "status": 503, "fault": "error"},
            {"name": "cleanup", "status": 200},
        ],
    }

    steps = selectors.execution_transcript(trace)

    assert [(s["kind"], s.get("name") or s.get("number")) for s in steps] == [
        ("llm", 1),
        ("tool", "warmup"),  # the agent's own call, before the one the model asked for
        ("tool", "lookup"),
        ("tool", "never_called"),  # asked for, never seen by the tool proxy
        ("llm", 2),
        ("tool", "cleanup"),
    ]
    lookup = steps[2]
    assert lookup["requested_by_model"] and lookup["fault"] == "error"
    assert lookup["requested_arguments"] == '{"id": 1}'
    assert not steps[1]["requested_by_model"]
    assert steps[3]["source"] == "model" and steps[3]["status"] is None
    assert steps[0]["reply"] == ""  # only tool calls: shown as "asks for"
    assert steps[0]["requested_tools"] == ['lookup({"id": 1})', "never_called({})"]
    assert steps[4]["fault"] == "rate_limit" and "slow" in steps[4]["reply"]
    assert selectors.execution_transcript(None) == []


def _synthetic_execution(world: World, replicas: int = 1) -> Execution:
    run = synthetic_run(synthetic_version(world.mine, replicas=replicas))
    return Execution.objects.filter(run=run).order_by("id").first()  # type: ignore[return-value]


def _artifact(target: Execution, kind: str, name: str, data: bytes) -> Artifact:
    artifact = Artifact(execution=target, kind=kind, name=name, size=len(data))
    artifact.file.save(name, ContentFile(data), save=False)
    artifact.save()
    return artifact


def test_large_artifacts_are_shown_capped_with_a_download_link(world: World) -> None:
    target = _synthetic_execution(world)
    stdout = _artifact(target, ArtifactKind.STDOUT, "stdout.txt", b"x" * (3 * 1024 * 1024) + b"END")
    trace = _artifact(
        target,
        ArtifactKind.TRACE,
        "trace.json",
        json.dumps({"llm_calls": [{"model": "m", "response": "y" * 3_000_000}]}).encode(),
    )

    response = world.client("viewer").get(page_url(world, target.pk))

    html = response.content.decode()
    assert len(response.content) < 400_000, "a large artifact was loaded into the page"
    assert "END" not in html
    assert "Showing the first 64.0" in html and "of 3.0" in html
    assert f'href="{download_url(world, target.pk, stdout.pk)}">Download the whole file' in html
    transcript = section(html, "transcript-title")
    assert "Too large to show here (2.9" in transcript
    assert f'href="{download_url(world, target.pk, trace.pk)}">download trace.json' in transcript


def test_unreadable_json_artifacts_say_why(world: World) -> None:
    target = _synthetic_execution(world)
    _artifact(target, ArtifactKind.HTTP_LOG, "http_log.json", b"{not json")
    gone = _artifact(target, ArtifactKind.DB_WRITES, "db_writes.json", b"[]")
    gone.file.storage.delete(gone.file.name)

    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    assert "Not readable as expected (not JSON)" in section(html, "http-title")
    assert "The stored file (db_writes.json) is missing." in section(html, "db-title")


def test_execution_without_artifacts_says_so(world: World) -> None:
    target = _synthetic_execution(world)

    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()

    assert "No LLM or tool calls were recorded." in html
    assert "The agent changed no file in its workspace." in html
    assert "No artifacts stored." in html


def test_execution_page_query_count_does_not_grow_with_the_run_or_results(world: World) -> None:
    client = world.client("viewer")

    def count(target: Execution) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(page_url(world, target.pk)).status_code == 200
        return len(queries)

    small = _synthetic_execution(world, replicas=1)
    large = _synthetic_execution(world, replicas=40)
    baseline = count(small)
    assert count(large) == baseline
    CheckResult.objects.bulk_create(
        CheckResult(
            execution=large,
            run_id=large.run_id,
            invariant_id=f"extra_{i}",
            check_type="contains",
            score=1.0,
            passed=True,
        )
        for i in range(50)
    )
    for kind in (ArtifactKind.STDOUT, ArtifactKind.STDERR, ArtifactKind.HTTP_LOG):
        _artifact(large, kind, f"{kind}.txt", b"[]" if kind == ArtifactKind.HTTP_LOG else b"hi")
    assert count(large) == baseline


# --- Downloads ----------------------------------------------------------------------------


def test_artifact_download_streams_the_stored_file(world: World) -> None:
    target = execution(world, "no-chaos")
    artifact = Artifact.objects.get(execution=target, kind=ArtifactKind.STDOUT)

    response = world.client("viewer").get(download_url(world, target.pk, artifact.pk))

    assert response.status_code == 200
    assert response.streaming
    data = b"".join(response.streaming_content)
    with artifact.file.storage.open(artifact.file.name, "rb") as handle:
        assert data == handle.read()
    assert b"hello, the order tool said" in data
    assert response["Content-Disposition"] == (
        f'attachment; filename="execution-{target.pk}-stdout.txt"'
    )


def test_artifact_download_refuses_mismatched_ids_and_missing_files(world: World) -> None:
    first, second = (execution(world, "no-chaos", 0, r) for r in (0, 1))
    artifact = Artifact.objects.get(execution=first, kind=ArtifactKind.STDOUT)
    client = world.client("admin")

    # The artifact of one execution under another execution's id.
    assert client.get(download_url(world, second.pk, artifact.pk)).status_code == 404
    # A row whose file is gone.
    gone = _artifact(first, ArtifactKind.FILE, "out/gone.txt", b"bye")
    gone.file.storage.delete(gone.file.name)
    response = client.get(download_url(world, first.pk, gone.pk))
    assert response.status_code == 404


# --- Permissions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "allowed"),
    [("viewer", True), ("reviewer", True), ("editor", True), ("admin", True), ("outsider", False)],
)
def test_execution_page_and_downloads_are_for_members_only(
    world: World, role: str, allowed: bool
) -> None:
    target = execution(world, "no-chaos")
    artifact = Artifact.objects.filter(execution=target).first()
    assert artifact is not None
    client = world.client(role)

    responses = [
        client.get(page_url(world, target.pk)),
        htmx(client, page_url(world, target.pk)),
        client.get(download_url(world, target.pk, artifact.pk)),
    ]

    assert [r.status_code for r in responses] == [200 if allowed else 404] * 3


def test_spec_download_is_for_members_of_the_project_only(world: World) -> None:
    link = reverse("spec_version_download", args=[world.mine.slug, "dash-agent", 1])
    assert world.client("viewer").get(link).status_code == 200
    assert world.client("outsider").get(link).status_code == 404
    missing = reverse("spec_version_download", args=[world.mine.slug, "dash-agent", 99])
    assert world.client("viewer").get(missing).status_code == 404


def test_another_projects_execution_and_artifact_are_404_under_this_slug(world: World) -> None:
    foreign_run = Run.objects.create(
        project=world.other, spec_version=world.other_run.spec_version, status=RunStatus.COMPLETED
    )
    foreign = Execution.objects.create(run=foreign_run, scenario="no-chaos")
    foreign_artifact = _artifact(foreign, ArtifactKind.STDOUT, "stdout.txt", b"secret")
    admin = world.client("admin")

    assert admin.get(page_url(world, foreign.pk)).status_code == 404
    assert admin.get(download_url(world, foreign.pk, foreign_artifact.pk)).status_code == 404
    # This project's execution id with the foreign artifact id, and the reverse.
    mine = execution(world, "no-chaos")
    assert admin.get(download_url(world, mine.pk, foreign_artifact.pk)).status_code == 404
    # The foreign project's own admin reads it under its own slug.
    outsider = world.client("outsider")
    own = reverse("artifact_download", args=[world.other.slug, foreign.pk, foreign_artifact.pk])
    assert outsider.get(page_url(world, foreign.pk, world.other.slug)).status_code == 200
    assert b"".join(outsider.get(own).streaming_content) == b"secret"


# --- The reproducer, run for real -----------------------------------------------------------


def _keystone(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_keystone(*args, env=embedded_env(home), timeout=180)


def test_reproducer_command_reruns_exactly_that_execution(world: World, tmp_path: Path) -> None:
    target = execution(world, "orders-down", 1, 1)
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()
    command = html_lib.unescape(
        re.search(r'<pre class="reproducer"><code>(.*?)</code>', html).group(1)
    )
    words = shlex.split(command)
    assert words[:3] == ["keystone", "run", "dash-agent.yaml"]
    # The file the command names is the page's download link: fetched, saved under the name
    # the server gives it, run.
    link = re.search(r'<a href="([^"]+)" download data-testid="spec-download">', html).group(1)
    download = world.client("viewer").get(link)
    assert download.status_code == 200
    assert download["Content-Disposition"] == 'attachment; filename="dash-agent.yaml"'
    assert download.content.decode() == world.version.source_yaml
    spec_file = tmp_path / "dash-agent.yaml"
    spec_file.write_bytes(download.content)
    report = tmp_path / "report.json"

    result = _keystone(tmp_path / "home", "run", str(spec_file), *words[3:], "--json", str(report))

    assert result.returncode == 1, result.stdout + result.stderr  # says_shipped fails there
    executions = json.loads(report.read_text())["executions"]
    assert [(e["scenario"], e["prompt_index"], e["replica"]) for e in executions] == [
        ("orders-down", 1, 1)
    ]
    assert "tool error 503" in executions[0]["output"]
    # Same cell key and run seed as the original: the same per-execution seed and faults.
    with sqlite3.connect(tmp_path / "home" / "keystone.sqlite3") as db:
        (key,) = db.execute("SELECT key FROM evaluations_execution").fetchone()
        (options,) = db.execute("SELECT options FROM evaluations_run").fetchone()
    assert key == target.key
    assert json.loads(options)["seed"] == 42


def test_keystone_run_refuses_a_prompt_index_or_replica_the_spec_does_not_have(
    tmp_path: Path, world: World
) -> None:
    spec_file = tmp_path / "dash-agent.yaml"
    spec_file.write_text(world.version.source_yaml)

    result = _keystone(
        tmp_path / "home", "run", str(spec_file), "--prompt-index", "0", "--replica", "7"
    )

    assert result.returncode == 2
    assert (
        "no execution of this spec matches the selection (prompt_index=0, replica=7)"
        in result.stderr
    )


ISOLATED_SPEC = """\
version: 1
id: isolated-agent
task: {prompts: ["one", "two"]}
agent: {type: command, command: "echo ok"}
isolation: per_invariant
invariants:
  says_ok: {description: "ok", check: {type: contains, value: ok}}
  short: {description: "short", check: {type: max_length, max: 10}}
replicas: 3
"""


def test_reproducer_of_an_isolated_execution_plans_exactly_that_execution(world: World) -> None:
    version = services.spec_version_create(project=world.mine, source_yaml=ISOLATED_SPEC)
    original = services.run_create(spec_version=version, seed=9, enqueue=False)
    services.run_plan(run_id=original.pk)
    target = Execution.objects.get(run=original, prompt_index=1, replica=2, invariant_id="short")
    html = world.client("viewer").get(page_url(world, target.pk)).content.decode()
    command = html_lib.unescape(
        re.search(r'<pre class="reproducer"><code>(.*?)</code>', html).group(1)
    )
    assert command == (
        "keystone run isolated-agent.yaml --scenario no-chaos --prompt-index 1 --replica 2 "
        "--invariant short --seed 9"
    )

    args = build_parser().parse_args(shlex.split(command)[1:])
    again = services.run_create(
        spec_version=version,
        scenarios=args.scenario,
        seed=args.seed,
        only=cli_selection(args),
        enqueue=False,
    )
    services.run_plan(run_id=again.pk)

    assert list(Execution.objects.filter(run=again).values_list("key", flat=True)) == [target.key]


def test_execution_page_says_why_it_failed(world: World) -> None:
    failed = execution(world, "orders-down")
    html = world.client("viewer").get(page_url(world, failed.pk)).content.decode()
    assert "<strong>Why:</strong> invariant `says_shipped` failed: output does not contain" in html
    passed = execution(world, "no-chaos")
    html = world.client("viewer").get(page_url(world, passed.pk)).content.decode()
    assert "Why:" not in html
