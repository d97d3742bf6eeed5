"""Output artifacts: the files an agent produced that count as its output (reference 003's
`RunArtifact.output_artifacts`, read by `output_artifact_present` and the workspace checks).

Two sources, read after the agent finished:
- the spec's `output_artifacts: [{path: <glob>, type: <artifact_type>}]`: every regular file
  of the workspace matching the glob is recorded with that type;
- `.keystone/artifacts.json`, written by the agent itself: a JSON list of
  `{"type": ..., "path": ...}` (a workspace file) or `{"type": ..., "uri": ...}`.

Only regular files inside the workspace count: a link, or a path that leaves the workspace,
is skipped with a warning, never followed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.artifact import OutputArtifact
from evaluations.runner.workspace import KEYSTONE_DIR

EMITTED_FILE = "artifacts.json"
EMITTED_MAX_BYTES = 64 * 1024
MAX_ARTIFACTS = 200


def collect_output_artifacts(
    workspace: Path, declared: list[dict[str, Any]]
) -> tuple[list[OutputArtifact], list[str]]:
    """The output artifacts of one execution, and warnings about entries that were skipped."""
    warnings: list[str] = []
    found: list[OutputArtifact] = []
    for entry in declared:
        for path in sorted(workspace.glob(str(entry["path"]))):
            relative = _inside(workspace, path)
            if relative is None or relative.split("/")[0] == KEYSTONE_DIR:
                continue
            found.append(OutputArtifact(artifact_type=str(entry["type"]), path=relative))
    emitted, problems = _emitted(workspace)
    warnings += problems
    found += emitted
    if len(found) > MAX_ARTIFACTS:
        warnings.append(
            f"output artifacts: {len(found)} recorded, only the first {MAX_ARTIFACTS} kept"
        )
    return found[:MAX_ARTIFACTS], warnings


def _inside(workspace: Path, path: Path) -> str | None:
    """The workspace-relative path of a regular file that is not a link and does not leave
    the workspace through one; None otherwise."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return path.resolve().relative_to(workspace.resolve()).as_posix()
    except ValueError:
        return None


def _emitted(workspace: Path) -> tuple[list[OutputArtifact], list[str]]:
    where = f"{KEYSTONE_DIR}/{EMITTED_FILE}"
    try:
        data, size = safe_files.read_bytes(workspace, where, cap=EMITTED_MAX_BYTES)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{where}: not read ({exc}); it must be a regular file"]
    if size > EMITTED_MAX_BYTES:
        return [], [f"{where}: larger than {EMITTED_MAX_BYTES} bytes, not read"]
    text = data.decode("utf-8", errors="replace")
    try:
        entries = json.loads(text)
    except ValueError as exc:
        return [], [f"{where}: not JSON ({exc})"]
    if not isinstance(entries, list):
        return [], [f'{where}: expected a list of {{"type", "path" or "uri"}}']
    found: list[OutputArtifact] = []
    warnings: list[str] = []
    for index, entry in enumerate(entries):
        kind = entry.get("type") if isinstance(entry, dict) else None
        if not isinstance(kind, str) or not kind:
            warnings.append(f"{where}[{index}]: needs a string 'type'")
            continue
        if isinstance(entry.get("uri"), str):
            found.append(OutputArtifact(artifact_type=kind, uri=entry["uri"]))
            continue
        path = entry.get("path")
        relative = _inside(workspace, workspace / path) if isinstance(path, str) else None
        if relative is None:
            warnings.append(
                f"{where}[{index}]: 'path' must name a regular file inside the workspace"
            )
            continue
        found.append(OutputArtifact(artifact_type=kind, path=relative))
    return found, warnings
