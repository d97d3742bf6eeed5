"""The base class of every check type (one small class per `check.type`)."""

from __future__ import annotations

from typing import Any, ClassVar

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.results import Outcome


class Check:
    """Base class. Subclasses set `type` (and `aliases`), and implement `evaluate`.

    `config` is the invariant's `check` mapping, already validated by the JSON Schema.
    `family` names what the check is about (used by suite gates such as pii_failures_max).
    """

    type: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    needs_service: ClassVar[bool] = False
    # Whether the check reads the workspace's files (or runs what does): an execution
    # writes its audit log and trace there (.keystone/) only for such checks.
    reads_workspace: ClassVar[bool] = False

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        raise NotImplementedError
