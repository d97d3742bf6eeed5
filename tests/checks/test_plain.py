"""checks/plain.py: the summary's and the JSON report's dicts, as `dataclasses.asdict` gave
them, without its deep copy (issue 18)."""

from __future__ import annotations

import dataclasses

from checks.plain import fields_dict
from checks.planning import PlannedExecution
from checks.report_model import GateResult, MatrixCell, ReplicaAggregate
from checks.results import CheckResult, FailureCode


def test_the_same_dict_as_asdict_for_nested_lists_and_dicts() -> None:
    objects = [
        CheckResult(
            "no-pii",
            "excludes_pii",
            False,
            0.0,
            FailureCode.PII_DETECTED,
            "an email address",
            details={"found": [{"kind": "email", "at": [3, 17]}], "n": 1},
            dimensions=["safety"],
        ),
        ReplicaAggregate(
            "contract",
            "no-chaos",
            0,
            None,
            "pass_at_k",
            True,
            "flaky",
            3,
            2,
            1.0,
            0.3,
            0.67,
            0.8,
            0.0,
            1.0,
            failure_codes=["x"],
            execution_ids=["1", "2", "3"],
            invariant_scores={"answers": {"n": 3, "passed": 2, "mean": 0.67}},
        ),  # fmt: skip
        MatrixCell("answers", "no-chaos", "high", 3, True, "pass", 1, 1, 3, 3),
        GateResult("pass_rate", False, None, 0.9, "no data", empty=True),
        PlannedExecution(
            "tool-down",
            1,
            "refund order 7",
            0,
            "replay",
            ["answers"],
            replay_session={"tool_responses": [{"name": "orders", "response": {"id": 7}}]},
        ),  # fmt: skip
    ]
    for obj in objects:
        assert fields_dict(obj) == dataclasses.asdict(obj), type(obj).__name__


def test_its_lists_and_dicts_are_copies_of_the_object_s() -> None:
    result = CheckResult("a", "contains", True, 1.0, details={"k": 1}, dimensions=["d"])
    data = fields_dict(result)
    data["details"]["k"] = 2
    data["dimensions"].append("e")
    assert result.details == {"k": 1} and result.dimensions == ["d"]
