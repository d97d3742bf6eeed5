"""The parsed form of a valid spec: typed, with the contract's defaults applied.

`Spec.from_dict` is only called on a mapping that passed validation (checks.spec.validate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITY_WEIGHTS = {"critical": 3, "high": 2, "medium": 1, "low": 1}
WHEN_VALUES = ("always", "tool_faults_active", "llm_faults_active", "any_chaos_active", "no_chaos")
DEFAULT_PILLAR_WEIGHTS = {"mutation": 0.20, "chaos": 0.35, "contract": 0.35, "replay": 0.10}
NO_CHAOS = "no-chaos"
# Where Keystone injects each context attack: `indirect_injection` into the tool answers the
# tool proxy relays, the others into the conversation the LLM gateway forwards to the model.
TOOL_ANSWER_ATTACKS = frozenset({"indirect_injection"})
CONVERSATION_ATTACKS = frozenset(
    {"memory_poisoning", "overflow", "conflicting_context", "injection_via_context"}
)


@dataclass(slots=True)
class Invariant:
    """One invariant of a spec: its check, how it counts (weight, gate, severity), when it
    applies, and its probe prompts."""

    id: str
    description: str
    check: dict[str, Any]
    weight: float = 1.0
    gate: bool = False
    severity: str = "medium"
    when: str = "always"
    negate: bool = False
    dimensions: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)

    @property
    def check_type(self) -> str:
        return str(self.check["type"])

    @property
    def severity_weight(self) -> int:
        return SEVERITY_WEIGHTS[self.severity]

    @classmethod
    def from_dict(cls, invariant_id: str, data: dict[str, Any]) -> Invariant:
        return cls(
            id=invariant_id,
            description=data.get("description", invariant_id),
            check=dict(data["check"]),
            weight=float(data.get("weight", 1.0)),
            gate=bool(data.get("gate", False)),
            severity=data.get("severity", "medium"),
            when=data.get("when", "always"),
            negate=bool(data.get("negate", False)),
            dimensions=list(data.get("dimensions", [])),
            probes=list(data.get("probes", [])),
        )


@dataclass(slots=True)
class Scenario:
    """One entry of the chaos matrix: the tool faults, LLM faults and context attacks it
    injects (a `profile` already expanded into them)."""

    name: str
    tool_faults: list[dict[str, Any]] = field(default_factory=list)
    llm_faults: list[dict[str, Any]] = field(default_factory=list)
    context_attacks: list[dict[str, Any]] = field(default_factory=list)
    profile: str | None = None

    @property
    def tool_faults_active(self) -> bool:
        return bool(self.tool_faults)

    @property
    def llm_faults_active(self) -> bool:
        return bool(self.llm_faults)

    @property
    def any_chaos_active(self) -> bool:
        return bool(self.tool_faults or self.llm_faults or self.context_attacks)

    def faults_by_channel(self) -> dict[str, list[str]]:
        """The kinds of fault this scenario injects, by where Keystone injects them: "proxy"
        (the tool proxy: tool faults, and indirect injection into the tool answers it relays)
        and "gateway" (the LLM gateway: LLM faults, and the attacks that rewrite the
        conversation it forwards). A channel with no fault is left out."""
        attacks = {str(a.get("type", "")) for a in self.context_attacks if isinstance(a, dict)}
        in_tool_answers = sorted(attacks & TOOL_ANSWER_ATTACKS)
        in_conversation = sorted(attacks - TOOL_ANSWER_ATTACKS)
        channels: dict[str, list[str]] = {}
        if self.tool_faults:
            channels.setdefault("proxy", []).append("tool_faults")
        if in_tool_answers:
            channels.setdefault("proxy", []).append(
                f"context_attacks ({', '.join(in_tool_answers)})"
            )
        if self.llm_faults:
            channels.setdefault("gateway", []).append("llm_faults")
        if in_conversation:
            channels.setdefault("gateway", []).append(
                f"context_attacks ({', '.join(in_conversation)})"
            )
        return channels

    def activates(self, when: str) -> bool:
        """Whether an invariant with this `when` is evaluated in this scenario."""
        if when == "always":
            return True
        if when == "no_chaos":
            return not self.any_chaos_active
        return bool(getattr(self, when))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        if data.get("profile"):
            from checks.profiles import resolve_scenario  # built-in profiles become their faults

            data = resolve_scenario(data)
        return cls(
            name=data["name"],
            tool_faults=list(data.get("tool_faults") or []),
            llm_faults=list(data.get("llm_faults") or []),
            context_attacks=list(data.get("context_attacks") or []),
            profile=data.get("profile"),
        )


@dataclass(slots=True)
class ScoringConfig:
    """The spec's `scoring` block: pass threshold, replica aggregation and pillar weights."""

    # None: an execution passes when every active invariant passed (docs/scoring.md).
    pass_threshold: float | None = None
    replica_aggregation: str = "all"
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PILLAR_WEIGHTS))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ScoringConfig:
        data = data or {}
        return cls(
            pass_threshold=(
                float(data["pass_threshold"]) if data.get("pass_threshold") is not None else None
            ),
            replica_aggregation=data.get("replica_aggregation", "all"),
            weights=dict(data.get("weights") or DEFAULT_PILLAR_WEIGHTS),
        )


@dataclass(slots=True)
class Spec:
    """A validated spec, typed. `raw` is the whole validated mapping: the blocks not parsed
    here (agent, services, forbidden...) are read from it."""

    id: str
    raw: dict[str, Any]
    prompts: list[str]
    invariants: dict[str, Invariant]
    scenarios: list[Scenario]
    scoring: ScoringConfig
    gates: dict[str, float]
    replicas: int = 1
    isolation: str = "per_execution"
    description: str = ""

    @property
    def agent(self) -> dict[str, Any]:
        return dict(self.raw.get("agent") or {})

    @property
    def forbidden(self) -> dict[str, Any]:
        return dict(self.raw.get("forbidden") or {})

    @property
    def services(self) -> list[dict[str, Any]]:
        return list(self.raw.get("services") or [])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spec:
        task = data.get("task") or {}
        prompts = list(task.get("prompts") or ([task["prompt"]] if task.get("prompt") else []))
        scenarios = [Scenario.from_dict(s) for s in data.get("chaos_matrix") or []] or [
            Scenario(NO_CHAOS)
        ]
        return cls(
            id=data["id"],
            raw=data,
            prompts=prompts,
            invariants={
                k: Invariant.from_dict(k, _with_drift_defaults(v, data))
                for k, v in (data.get("invariants") or {}).items()
            },
            scenarios=scenarios,
            scoring=ScoringConfig.from_dict(data.get("scoring")),
            gates=dict(data.get("gates") or {}),
            replicas=int(data.get("replicas", 1)),
            isolation=data.get("isolation", "per_execution"),
            description=data.get("description", ""),
        )


def _with_drift_defaults(invariant: Any, data: dict[str, Any]) -> Any:
    """The top-level `baseline: {drift: {method, max_score, fields}}` block gives every
    `drift` check the settings it does not set itself."""
    defaults = (data.get("baseline") or {}).get("drift") or {}
    check = invariant.get("check") if isinstance(invariant, dict) else None
    if not defaults or not isinstance(check, dict) or check.get("type") != "drift":
        return invariant
    return {**invariant, "check": {**defaults, **check}}
