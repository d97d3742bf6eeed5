"""Leases of running executions: renewed while their agents run, by one thread per process
whatever the number of executions (issue 18: a thread per execution cost each one a start
and a join), and given up when the execution is recorded. Rows are committed
(transaction=True): the renewing thread has its own connection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from evaluations import services
from evaluations.models import Execution, ExecutionStatus, Project
from tests.evaluations.execution_helpers import planned_run

pytestmark = [pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: leases
task: {prompts: ["a", "b"]}
agent: {type: command, command: "sleep 3.5; echo done", timeout: 60}
sandbox: {backend: local}
invariants:
  completes: {description: it ran, check: {type: completes}}
"""


def test_running_executions_have_their_leases_renewed_by_one_thread(
    settings: Any, tmp_path: Path
) -> None:
    settings.KEYSTONE_EXECUTION_LEASE_SECONDS = 3  # renewed every second
    project = Project.objects.create(name="leases", slug="leases")
    _, ids = planned_run(project, SPEC, spec_dir=str(tmp_path))
    assert len(ids) == 2

    def execute(execution_id: int) -> None:
        try:
            services.execution_execute(execution_id=execution_id, worker="leases:1")
        finally:
            connection.close()

    threads = [threading.Thread(target=execute, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    seen: dict[int, set[Any]] = {i: set() for i in ids}
    while any(thread.is_alive() for thread in threads):
        for execution_id, expires in Execution.objects.filter(
            pk__in=ids, status=ExecutionStatus.RUNNING
        ).values_list("pk", "lease_expires"):
            seen[execution_id].add(expires)
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    # The claim's lease, then at least two renewals in 3.5 s, each one later than the last.
    assert all(len(leases) >= 3 for leases in seen.values()), seen
    done = Execution.objects.filter(pk__in=ids)
    assert all(e.status == ExecutionStatus.SUCCESS and e.lease_expires is None for e in done)
    lease_threads = [t for t in threading.enumerate() if t.name == "leases"]
    assert len(lease_threads) == 1


def test_an_agent_that_starts_after_the_cancelling_round_is_stopped_at_once(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in `keystone run` cancels the run and asks for a lease round at once, but an
    execution claimed just before holds no lease yet: its agent starts after that round. It
    must still be stopped at once, not at the next round (a third of a lease: 20 s by
    default), which left `keystone run` waiting after Ctrl-C (seen in CI under load)."""
    from evaluations.runner import harness

    settings.KEYSTONE_EXECUTION_LEASE_SECONDS = 60  # the next round would be 20 s away
    project = Project.objects.create(name="late", slug="late")
    run, ids = planned_run(
        project,
        SPEC.replace("sleep 3.5", "sleep 60").replace('"a", "b"', '"a"'),
        spec_dir=str(tmp_path),
    )
    real_choose_sandbox = harness.choose_sandbox

    def ctrl_c_between_claim_and_lease(*args: Any, **kwargs: Any) -> Any:
        # What `keystone run`'s main thread does on Ctrl-C, while this execution is claimed
        # but holds no lease yet.
        services.run_cancel(run_id=run.pk)
        services.execution_leases_renew_now()
        time.sleep(0.3)  # the round it asked for has run, with no lease of this execution
        return real_choose_sandbox(*args, **kwargs)

    monkeypatch.setattr(harness, "choose_sandbox", ctrl_c_between_claim_and_lease)
    started = time.monotonic()
    finished = threading.Event()

    def execute() -> None:
        try:
            services.execution_execute(execution_id=ids[0], worker="late:1")
        finally:
            connection.close()
            finished.set()

    threading.Thread(target=execute, daemon=True).start()
    assert finished.wait(timeout=10), "the agent ran on after its run was cancelled"
    assert time.monotonic() - started < 10
    execution = Execution.objects.get(pk=ids[0])
    assert execution.status == ExecutionStatus.ERROR and execution.error == "cancelled"
