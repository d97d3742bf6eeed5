"""Replay files (the regression pillar) from stored executions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluations.models import (
    Artifact,
    ArtifactKind,
    Execution,
    ExecutionStatus,
    Run,
)


def execution_replay_session(*, execution_id: int, project_id: int) -> Any:
    """A replay session (evaluations.runner.replay.ReplaySession) from a stored execution of
    the project: its prompt and the tool answers its agent saw. None if there is none."""
    from checks.artifact import RunArtifact
    from evaluations.runner.replay import session_from_artifact

    execution = Execution.objects.filter(pk=execution_id, project_id=project_id).first()
    if execution is None:
        return None
    stored = Artifact.objects.filter(execution=execution, kind=ArtifactKind.ARTIFACT_JSON).first()
    if stored is None:
        return None
    with stored.file.open("rb") as handle:
        artifact = RunArtifact.from_dict(json.loads(handle.read()))
    return session_from_artifact(
        execution.prompt,
        artifact,
        id=f"run-{execution.run_id}-execution-{execution.pk}",
        context={"scenario": execution.scenario, "replica": execution.replica},
    )


def run_replay_export(*, run_id: int, out_dir: str | Path, failed_only: bool = True) -> list[Path]:
    """Write the run's failed executions (or all with failed_only=False) as replay files,
    one `run-R-execution-E.json` each; executions that kept no artifact are left out."""
    from evaluations.runner.replay import save_session

    run = Run.objects.get(pk=run_id)
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    executions = Execution.objects.filter(run=run).exclude(
        status__in=[ExecutionStatus.PENDING, ExecutionStatus.RUNNING]
    )
    if failed_only:
        executions = executions.exclude(passed=True)
    written = []
    for execution_id in executions.order_by("id").values_list("id", flat=True):
        session = execution_replay_session(execution_id=execution_id, project_id=run.project_id)
        if session is not None:
            written.append(save_session(session, target / f"{session.id}.json"))
    return written
