"""The data that scoring reads and writes: stored executions in, a RunSummary out.

Everything here is plain data with `to_dict`/`from_dict`, so a run can be written to a JSON
report and scored again later (`keystone score`), or rebuilt from database rows by the web app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from checks.metrics import PILLAR_METRICS
from checks.plain import fields_dict
from checks.results import CheckResult

if TYPE_CHECKING:
    from checks.artifact import RunArtifact
    from checks.spec.model import Spec

PILLARS = ("contract", "chaos", "mutation", "replay")
# Pillars whose executions are (scenario x prompt) runs of the golden prompts or probes.
MATRIX_PILLARS = ("contract", "chaos")


@dataclass(slots=True)
class ExecutionRecord:
    """One stored agent invocation and the check results computed on it."""

    id: str
    scenario: str
    prompt_index: int = 0
    prompt: str = ""
    replica: int = 0
    attempt: int = 1
    status: str = "success"  # checks.artifact.EXECUTION_STATUSES
    duration_ms: float = 0.0
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    results: list[CheckResult] = field(default_factory=list)
    forbidden_violations: list[dict[str, Any]] = field(default_factory=list)
    pillar: str = "contract"  # contract | chaos | mutation | replay
    mutation_type: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    output: str = ""  # the final output, kept for the stateful-agent warning
    error: str | None = None
    # Calls through the LLM gateway and the tool proxy, where faults are injected: a faulted
    # scenario none of whose executions called either measured nothing (a run warning).
    # None: not counted (a row or report from before Keystone counted them).
    gateway_calls: int | None = None
    proxy_calls: int | None = None
    # Models the gateway had no price for: `cost_usd` leaves their calls out, so it is no
    # total a cost gate can pass on.
    unpriced_models: list[str] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["results"] = [result.to_dict() for result in self.results]
        data["forbidden_violations"] = [dict(v) for v in self.forbidden_violations]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionRecord:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["id"] = str(values.get("id", ""))
        values["results"] = [CheckResult.from_dict(r) for r in data.get("results") or []]
        values["forbidden_violations"] = list(data.get("forbidden_violations") or [])
        return cls(**values)

    @classmethod
    def from_artifact(
        cls,
        artifact: RunArtifact,
        results: list[CheckResult],
        *,
        id: str,
        scenario: str,
        forbidden_violations: list[dict[str, Any]] | None = None,
        **identity: Any,
    ) -> ExecutionRecord:
        """Build the record the in-process runner scores, from what the agent left behind."""
        calls = artifact.all_tool_calls()
        failed_calls = artifact.failed_tool_calls()
        return cls(
            id=id,
            scenario=scenario,
            status=artifact.status,
            duration_ms=artifact.duration_ms,
            cost_usd=artifact.cost_usd,
            input_tokens=artifact.input_tokens,
            output_tokens=artifact.output_tokens,
            results=list(results),
            forbidden_violations=list(forbidden_violations or []),
            tool_calls=len(calls),
            tool_errors=len(failed_calls),
            output=artifact.final_output,
            error=artifact.error,
            gateway_calls=len(artifact.llm_calls),
            proxy_calls=len(artifact.tool_calls),
            unpriced_models=artifact.unpriced_models(),
            **identity,
        )


@dataclass(slots=True)
class ExecutionScore:
    """The composite and verdict of one execution."""

    execution_id: str
    scenario: str
    prompt_index: int
    replica: int
    pillar: str
    mutation_type: str | None
    composite: float
    passed: bool
    status: str  # pass | fail | error
    gate_failed: list[str] = field(default_factory=list)  # gate invariants below 1.0
    forbidden: int = 0  # number of forbidden-rule violations
    failure_codes: list[str] = field(default_factory=list)
    vacuous: bool = False  # no invariant was active: composite 1.0 by definition
    reason: str = ""  # why it did not pass, in words ("" when it passed)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(slots=True)
class ReplicaAggregate:
    """The verdict of one (scenario x prompt) group over its replicas."""

    pillar: str
    scenario: str
    prompt_index: int
    mutation_type: str | None
    method: str
    passed: bool
    status: str  # pass | fail | flaky | error
    n: int
    c: int  # replicas that passed
    pass_at_k: float  # k = n
    pass_hat_k: float  # pass^k, k = n
    pass_at_1: float
    mean_composite: float
    min_composite: float
    max_composite: float
    failure_codes: list[str] = field(default_factory=list)
    execution_ids: list[str] = field(default_factory=list)
    prompt: str = ""
    # Each invariant's score across the replicas: {id: {n, passed, mean, min, max}} (KindLM's
    # assertionScores), so a flaky invariant shows how far apart its replicas were.
    invariant_scores: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        label = f"{self.scenario} / prompt {self.prompt_index}"
        if self.mutation_type:
            label += f" / {self.mutation_type}"
        return label if self.pillar in MATRIX_PILLARS else f"{self.pillar}: {label}"

    def to_dict(self) -> dict[str, Any]:
        data = fields_dict(self)
        data["key"] = self.key
        return data


@dataclass(slots=True)
class MatrixCell:
    """One invariant in one scenario, over every group of that scenario where it was active."""

    invariant_id: str
    scenario: str
    severity: str
    severity_weight: int
    passed: bool
    status: str  # pass | fail | error
    groups_passed: int
    groups_total: int
    results_passed: int
    results_total: int
    failure_codes: list[str] = field(default_factory=list)
    # Results that passed their own check but, as a gate, scored below 1.0 and so forced
    # their execution's composite to 0: "pass 1/1" alone would read as no harm done.
    gates_below_one: int = 0

    @property
    def label(self) -> str:
        """The cell as the terminal and Markdown show it: "pass 1/1 (gate < 1.0)"."""
        text = f"{self.status} {self.groups_passed}/{self.groups_total}"
        return text + (" (gate < 1.0)" if self.gates_below_one else "")

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(slots=True)
class Resilience:
    """The run's resilience: the severity-weighted share of matrix cells that passed, and its
    failing critical cells (any one fails the run)."""

    score: float | None  # 0..100, None when there is no cell
    critical_failed: bool
    critical_failures: int
    critical_cells: int
    passed_weight: float
    total_weight: float

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(slots=True)
class GateResult:
    """One gate of the run: the measured value against its threshold, whether it passed, and
    the message the reports print."""

    name: str
    passed: bool
    actual: float | None
    threshold: float
    message: str
    empty: bool = False  # no data: passes, flagged

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(slots=True)
class RunMetrics:
    """Figures of the whole run: executions, pass rate, durations, tool calls, tokens, cost,
    tool success rate and the judge's mean score."""

    executions: int
    pass_rate: float | None
    mean_duration_ms: float | None
    p95_duration_ms: float | None
    mean_tool_calls: float | None
    mean_tokens: float | None
    total_cost_usd: float
    cost_per_execution_usd: float | None
    tool_success_rate: float | None
    judge_mean: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(slots=True)
class RunSummary:
    """Everything `score_run` computes for a run. `spec` and `records` are its inputs, kept
    so that reporters need only this object; they are not part of `to_dict`."""

    spec_id: str
    executions: list[ExecutionScore]
    groups: list[ReplicaAggregate]
    matrix: list[MatrixCell]
    resilience: Resilience
    pillar_scores: dict[str, float | None]
    overall: float | None
    pass_rate: float | None
    gates: list[GateResult]
    verdict: str  # pass | fail | error
    exit_code: int
    metrics: RunMetrics
    warnings: list[str] = field(default_factory=list)
    kappa: float | None = None
    spec: Spec | None = field(default=None, repr=False)
    records: list[ExecutionRecord] = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def failure_reasons(self, *, limit: int = 10) -> tuple[list[tuple[str, str, str]], int]:
        """(status, where, why) of the executions that did not pass, the first `limit`, and
        how many more there are."""
        failed = [e for e in self.executions if not e.passed]
        rows = []
        for score in failed[:limit]:
            where = f"{score.scenario} / prompt {score.prompt_index} / replica {score.replica}"
            if score.mutation_type:
                where += f" / {score.mutation_type}"
            rows.append((score.status, where, score.reason or score.status))
        return rows, max(0, len(failed) - limit)

    def metric(self, name: str) -> float | None:
        """One figure of the run by name (SUMMARY_METRICS); None when the run has no data."""
        if name == "resilience":
            return self.resilience.score
        if name in ("overall", "pass_rate"):
            return self.overall if name == "overall" else self.pass_rate
        if name in PILLAR_METRICS:
            return self.pillar_scores.get(name)
        return {
            "judge_mean": self.metrics.judge_mean,
            "cost_usd": self.metrics.total_cost_usd,
            "p95_duration_ms": self.metrics.p95_duration_ms,
        }[name]

    def to_dict(self, *, per_execution: bool = True) -> dict[str, Any]:
        """The summary as JSON data. `per_execution=False` leaves out the one part that grows
        with the replicas, each execution's score: what a run stores, whose executions keep
        their own rows (a report file keeps the list: it has nothing else)."""
        scores = [e.to_dict() for e in self.executions] if per_execution else None
        return {
            "spec_id": self.spec_id,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "overall": self.overall,
            "pass_rate": self.pass_rate,
            "pillar_scores": dict(self.pillar_scores),
            "resilience": self.resilience.to_dict(),
            "gates": [g.to_dict() for g in self.gates],
            "metrics": self.metrics.to_dict(),
            "groups": [g.to_dict() for g in self.groups],
            "matrix": [c.to_dict() for c in self.matrix],
            **({"executions": scores} if scores is not None else {}),
            "warnings": list(self.warnings),
            # The first executions that did not pass and why, for pages that do not read
            # the per-execution list (it grows with the run).
            "why_failed": [
                {"status": s, "where": w, "reason": r} for s, w, r in self.failure_reasons()[0]
            ],
            "kappa": self.kappa,
        }
