"""Checks on the workspace the agent left behind. Paths are workspace-relative; a path that
escapes the workspace is a CHECK_ERROR, never a read of the server's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checks.artifact import FileChange, RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    compile_regex,
    get_optional_str,
    get_str,
    get_str_list,
    guarded,
    normalise,
    preview,
    quote,
    read_text,
    resolve_inside,
    snippet,
    workspace_file,
    workspace_root,
)
from checks.results import FailureCode, Outcome


def _kind(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return "broken symlink"
    if path.is_dir():
        return "directory"
    if path.is_file():
        return "file"
    return "special file"


class _WorkspaceCheck(Check):
    reads_workspace = True  # a path may name .keystone/audit.jsonl as well as the agent's


class FileExistsCheck(_WorkspaceCheck):
    type = "file_exists"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "path")
        target = workspace_file(artifact, context, relative)
        if target.is_file():
            return Outcome.ok(f"file {relative} exists", path=relative, size=target.stat().st_size)
        if target.exists():
            return Outcome.fail(
                FailureCode.FILE_MISSING,
                f"{relative} exists but is a {_kind(target)}, not a regular file",
                path=relative,
            )
        return Outcome.fail(
            FailureCode.FILE_MISSING, f"file {relative} does not exist", path=relative
        )


class FileAbsentCheck(_WorkspaceCheck):
    type = "file_absent"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "path")
        target = workspace_file(artifact, context, relative)
        # lexists: a dangling symlink is still "something at path".
        if target.exists() or target.is_symlink():
            return Outcome.fail(
                FailureCode.FILE_PRESENT,
                f"{_kind(target)} {relative} exists but should not",
                path=relative,
            )
        return Outcome.ok(f"nothing at {relative}", path=relative)


class PathExistsCheck(_WorkspaceCheck):
    type = "path_exists"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "path")
        target = workspace_file(artifact, context, relative)
        if target.exists():
            return Outcome.ok(f"{_kind(target)} {relative} exists", path=relative)
        return Outcome.fail(
            FailureCode.FILE_MISSING, f"path {relative} does not exist", path=relative
        )


def _content_failures(
    text: str, contains: str | None, not_contains: str | None, pattern: str | None
) -> list[tuple[FailureCode, str, dict[str, object]]]:
    """Every failed condition of file_content, in the order the contract lists them."""
    failures: list[tuple[FailureCode, str, dict[str, object]]] = []
    if contains is not None and contains not in text:
        failures.append((FailureCode.CONTAINS_FAILED, f"does not contain {quote(contains)}", {}))
    if not_contains is not None:
        index = text.find(not_contains)
        if index >= 0:
            context = snippet(text, index, index + len(not_contains))
            failures.append(
                (
                    FailureCode.NOT_CONTAINS_FAILED,
                    f"contains {quote(not_contains)}",
                    {"context": context},
                )
            )
    if pattern is not None and compile_regex(pattern, 0).search(text) is None:
        failures.append((FailureCode.PATTERN_FAILED, f"does not match /{pattern}/", {}))
    return failures


class FileContentCheck(_WorkspaceCheck):
    type = "file_content"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "path")
        contains = get_optional_str(self.config, "contains")
        not_contains = get_optional_str(self.config, "not_contains")
        pattern = get_optional_str(self.config, "pattern")
        if contains is None and not_contains is None and pattern is None:
            raise ConfigError("one of 'contains', 'not_contains' or 'pattern' is required")
        if pattern is not None:
            compile_regex(pattern)  # a bad pattern is a config error even when the file is missing
        target = workspace_file(artifact, context, relative)
        if not target.is_file():
            return Outcome.fail(
                FailureCode.FILE_MISSING, f"file {relative} does not exist", path=relative
            )
        text = read_text(target)
        failures = _content_failures(text, contains, not_contains, pattern)
        if failures:
            code, _, _ = failures[0]
            reasons = "; ".join(reason for _, reason, _ in failures)
            extra: dict[str, Any] = {}
            for _, _, more in failures:
                extra.update(more)
            return Outcome.fail(
                code,
                f"{relative} {reasons}",
                path=relative,
                failed=[c.value for c, _, _ in failures],
                content_preview=preview(text, 300),
                **extra,
            )
        return Outcome.ok(f"{relative} satisfies every content condition", path=relative)


class FileContainsCheck(_WorkspaceCheck):
    type = "file_contains"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "path")
        text = get_str(self.config, "text")
        target = workspace_file(artifact, context, relative)
        if not target.is_file():
            return Outcome.fail(
                FailureCode.FILE_MISSING, f"file {relative} does not exist", path=relative
            )
        content = read_text(target)
        if text not in content:
            return Outcome.fail(
                FailureCode.CONTAINS_FAILED,
                f"{relative} does not contain {quote(text)}",
                path=relative,
                content_preview=preview(content, 300),
            )
        return Outcome.ok(f"{relative} contains {quote(text)}", path=relative)


def _ends_with(path: str, suffix: str) -> bool:
    """Path-component suffix: 'out/report.md' ends with 'report.md' but 'myreport.md' does not."""
    path = path.replace("\\", "/").removeprefix("./")
    suffix = suffix.replace("\\", "/").removeprefix("./").lstrip("/")
    return path == suffix or path.endswith("/" + suffix)


class WorkspaceFilePresentCheck(_WorkspaceCheck):
    type = "workspace_file_present"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        relative = get_str(self.config, "relative_path")
        contains = get_optional_str(self.config, "contains")
        contains_all = get_str_list(self.config, "contains_all")
        contains_any = get_str_list(self.config, "contains_any")
        if contains is not None and (contains_all or contains_any):
            raise ConfigError("'contains' may not be mixed with 'contains_all' / 'contains_any'")

        found_path, text = self._locate(artifact, context, relative)
        if found_path is None:
            return Outcome.fail(
                FailureCode.FILE_MISSING,
                f"no file ending with {relative} was written or exists in the workspace",
                relative_path=relative,
                written=[c.path for c in artifact.workspace_diff if c.change != "removed"][:50],
            )
        if contains is None and not contains_all and not contains_any:
            return Outcome.ok(f"{found_path} is present", path=found_path)
        if text is None:
            raise ConfigError(f"the content of {found_path} is not available")

        problems: list[str] = []
        details: dict[str, Any] = {"path": found_path}
        if contains is not None and contains not in text:
            problems.append(f"does not contain {quote(contains)}")
        if contains_all or contains_any:
            folded = normalise(text)
            missing = [v for v in contains_all if normalise(v) not in folded]
            if missing:
                problems.append(f"is missing {', '.join(quote(v, 40) for v in missing)}")
                details["missing"] = missing
            if contains_any and not any(normalise(v) in folded for v in contains_any):
                problems.append(f"contains none of {', '.join(quote(v, 40) for v in contains_any)}")
                details["expected_any"] = contains_any
        if problems:
            details["content_preview"] = preview(text, 300)
            return Outcome.fail(
                FailureCode.CONTAINS_FAILED, f"{found_path} {'; '.join(problems)}", **details
            )
        return Outcome.ok(f"{found_path} is present with the expected content", **details)

    @staticmethod
    def _locate(
        artifact: RunArtifact, context: CheckContext, relative: str
    ) -> tuple[str | None, str | None]:
        """The written (diff) or recorded (output artifact) file ending with `relative`, else the
        file at `relative` in the workspace; with its text when it can be had."""
        root: Path | None
        try:
            root = workspace_root(artifact, context)
        except ConfigError:
            root = None
        candidates: list[FileChange] = [
            c
            for c in artifact.workspace_diff
            if c.change != "removed" and _ends_with(c.path, relative)
        ]
        for change in candidates:
            if change.content is not None:
                return change.path, change.content
            if root is not None:
                target = resolve_inside(root, change.path)
                if target.is_file():
                    return change.path, read_text(target)
            return change.path, None
        for output in artifact.output_artifacts:
            if output.path and _ends_with(output.path, relative) and root is not None:
                target = resolve_inside(root, output.path)
                if target.is_file():
                    return output.path, read_text(target)
        if root is not None:
            target = resolve_inside(root, relative)
            if target.is_file():
                return relative, read_text(target)
        return None, None


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (
    FileExistsCheck,
    FileAbsentCheck,
    PathExistsCheck,
    FileContentCheck,
    FileContainsCheck,
    WorkspaceFilePresentCheck,
)
