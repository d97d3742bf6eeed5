"""Issue 20, item 6: a pool child killed (as by the OOM killer) gets its task redelivered at
once, and the execution it held is taken again at once, not after its lease expires; any
other claimant still waits for the lease."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from evaluations import services
from evaluations.models import Execution, ExecutionStatus, Project

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: held
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


def test_the_same_task_back_takes_over_a_lease_its_dead_process_held(project: Project) -> None:
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, enqueue=False)
    [execution_id] = services.run_plan(run_id=run.pk)
    task = str(uuid.uuid4())
    assert services.execution_claim(execution_id=execution_id, worker=f"node-a:{task}")
    # Another task, or the embedded worker, must wait for the lease: the holder may be alive.
    assert not services.execution_claim(execution_id=execution_id, worker=f"node-b:{uuid.uuid4()}")
    assert not services.execution_claim(execution_id=execution_id, worker="embedded:42")
    # The same task id redelivered (its process died): taken at once, as attempt 2.
    assert services.execution_claim(execution_id=execution_id, worker=f"node-b:{task}")
    execution = Execution.objects.get(pk=execution_id)
    assert (execution.status, execution.claimed_by, execution.attempt) == (
        ExecutionStatus.RUNNING,
        f"node-b:{task}",
        2,
    )


def test_files_a_dead_holder_wrote_without_rows_are_removed_on_takeover(
    project: Project, settings: Any, tmp_path: Any
) -> None:
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, enqueue=False)
    [execution_id] = services.run_plan(run_id=run.pk)
    task = str(uuid.uuid4())
    assert services.execution_claim(execution_id=execution_id, worker=f"node-a:{task}")
    # The holder wrote a file, then was killed before its Artifact row.
    orphan = default_storage.save(
        f"runs/{run.pk}/executions/{execution_id}/stdout.txt", ContentFile(b"half")
    )
    assert default_storage.exists(orphan)
    assert services.execution_claim(execution_id=execution_id, worker=f"node-b:{task}")
    assert not default_storage.exists(orphan)
