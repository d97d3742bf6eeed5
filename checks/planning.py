"""Expanding a spec into the executions of a run (pure; the tasks and the CLI both use it).

A run is scenarios x prompts x replicas. Invariants with `probes` get their own executions
(the probe prompts instead of the golden prompts, evaluating only those invariants), and
`isolation: per_invariant` gives each invariant its own invocation, as Flakestorm does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from checks.plain import fields_dict
from checks.spec.model import Invariant, Scenario, Spec

# Execution.key's column size (evaluations.models uses this constant).
EXECUTION_KEY_MAX = 400


def execution_key(
    *,
    pillar: str,
    scenario: str,
    prompt_index: int,
    replica: int,
    mutation_type: str = "",
    invariant_id: str | None = None,
) -> str:
    """The one identity of an execution within its run: the database's unique key
    (Execution.key) and the input of its fault seed, so a re-run injects the same faults."""
    # A NULL invariant_id would escape a plain unique constraint (NULLs are distinct),
    # so the identity is folded into one non-null string.
    key = "|".join(
        [pillar, scenario, str(prompt_index), str(replica), mutation_type, invariant_id or ""]
    )
    if len(key) <= EXECUTION_KEY_MAX:
        return key
    # Long scenario / invariant names: keep a readable head, and the hash of the whole
    # key so two long keys with the same head stay distinct.
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[: EXECUTION_KEY_MAX - 65]}#{digest}"


def execution_seed(run_seed: int, key: str) -> int:
    """Deterministic per execution under the run's seed (sha256, not hash(): stable across
    processes and machines)."""
    digest = hashlib.sha256(f"{run_seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(slots=True)
class PlannedExecution:
    """One execution of a run as planned: scenario, prompt and replica, its pillar, the
    invariants it scores, and the mutant or replay session it runs, if any."""

    scenario: str
    prompt_index: int
    prompt: str
    replica: int
    pillar: str = "contract"  # contract | chaos | mutation | replay
    invariant_ids: list[str] = field(default_factory=list)  # which invariants this execution scores
    isolated_invariant: str | None = None  # set under per_invariant isolation and for probes
    mutation_type: str | None = None
    replay_session: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """Unique within a run, and equal to the Execution row's key."""
        return execution_key(
            pillar=self.pillar,
            scenario=self.scenario,
            prompt_index=self.prompt_index,
            replica=self.replica,
            mutation_type=self.mutation_type or "",
            invariant_id=self.isolated_invariant,
        )

    def seed(self, run_seed: int) -> int:
        """Deterministic per execution, so a re-run of one execution injects the same faults."""
        return execution_seed(run_seed, self.key)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


def scenario_pillar(scenario: Scenario) -> str:
    return "chaos" if scenario.any_chaos_active else "contract"


def plan_run(
    spec: Spec,
    *,
    replicas: int | None = None,
    scenarios: list[str] | None = None,
    mutations: list[tuple[int, str, int, str]] | None = None,
    replay_sessions: list[dict[str, Any]] | None = None,
) -> list[PlannedExecution]:
    """Every execution of a run. `mutations` are (prompt_index, type, mutant number, mutated
    prompt) from the runner's mutation generator; `replay_sessions` are loaded session dicts.

    A mutant runs once, in the first scenario without chaos; its number is the execution's
    replica, so the `count` mutants of one type and prompt form one group in the report."""
    replica_count = replicas or spec.replicas
    chosen = [s for s in spec.scenarios if not scenarios or s.name in scenarios]
    unknown = set(scenarios or []) - {s.name for s in spec.scenarios}
    if unknown:
        names = ", ".join(s.name for s in spec.scenarios)
        raise ValueError(f"unknown scenario {sorted(unknown)[0]!r}; the spec has: {names}")
    golden = [inv for inv in spec.invariants.values() if not inv.probes]
    probed = [inv for inv in spec.invariants.values() if inv.probes]
    plan: list[PlannedExecution] = []
    for scenario in chosen:
        pillar = scenario_pillar(scenario)
        active = [inv for inv in golden if scenario.activates(inv.when)]
        for replica in range(replica_count):
            for index, prompt in enumerate(spec.prompts):
                plan.extend(
                    _golden_executions(spec, scenario.name, pillar, index, prompt, replica, active)
                )
            for invariant in probed:
                if not scenario.activates(invariant.when):
                    continue
                for probe_index, probe in enumerate(invariant.probes):
                    plan.append(
                        PlannedExecution(
                            scenario=scenario.name,
                            prompt_index=1000
                            + probe_index,  # probes never collide with golden prompts
                            prompt=probe,
                            replica=replica,
                            pillar=pillar,
                            invariant_ids=[invariant.id],
                            isolated_invariant=invariant.id,
                        )
                    )
    baseline = next((s for s in spec.scenarios if not s.any_chaos_active), None)
    for index, mutation_type, mutant, mutated in mutations or []:
        plan.append(
            PlannedExecution(
                scenario=baseline.name if baseline else "no-chaos",
                prompt_index=index,
                prompt=mutated,
                replica=mutant,
                pillar="mutation",
                invariant_ids=[inv.id for inv in golden if inv.when in ("always", "no_chaos")],
                mutation_type=mutation_type,
            )
        )
    for session_index, session in enumerate(replay_sessions or []):
        plan.append(
            PlannedExecution(
                scenario="replay",
                prompt_index=session_index,
                prompt=str(session.get("input", "")),
                replica=0,
                pillar="replay",
                invariant_ids=[inv.id for inv in golden if inv.when in ("always", "no_chaos")],
                replay_session=session,
            )
        )
    return plan


def _golden_executions(
    spec: Spec,
    scenario: str,
    pillar: str,
    index: int,
    prompt: str,
    replica: int,
    active: list[Invariant],
) -> list[PlannedExecution]:
    if spec.isolation == "per_invariant":
        return [
            PlannedExecution(
                scenario, index, prompt, replica, pillar, [inv.id], isolated_invariant=inv.id
            )
            for inv in active
        ]
    return [PlannedExecution(scenario, index, prompt, replica, pillar, [inv.id for inv in active])]


# A run may execute only part of its plan: re-running the failed groups of an earlier run,
# or one execution reproduced from the CLI. A selection is a list of selectors; a planned
# execution is kept when every field of at least one selector equals its own.
SELECTION_FIELDS = ("pillar", "scenario", "prompt_index", "replica", "mutation_type", "invariant")


def validate_selection(selection: Any) -> list[dict[str, Any]]:
    """The selection in its stored form, or ValueError naming the selector and field at fault."""
    if not isinstance(selection, list) or not selection:
        raise ValueError("a selection is a non-empty list of selectors")
    cleaned: list[dict[str, Any]] = []
    for index, selector in enumerate(selection):
        if not isinstance(selector, dict) or not selector:
            raise ValueError(f"selector {index}: expected a non-empty mapping of fields")
        unknown = sorted(set(selector) - set(SELECTION_FIELDS))
        if unknown:
            raise ValueError(
                f"selector {index}: unknown field {unknown[0]!r} "
                f"(known: {', '.join(SELECTION_FIELDS)})"
            )
        for name in ("prompt_index", "replica"):
            value = selector.get(name)
            if name in selector and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"selector {index}: {name} must be an integer >= 0, got {value!r}")
        # An absent mutation or isolated invariant is stored as "", as in execution keys.
        stored = dict(selector)
        for name in ("mutation_type", "invariant"):
            if name in stored and stored[name] is None:
                stored[name] = ""
        cleaned.append(stored)
    return cleaned


def _selector_fields(planned: PlannedExecution) -> dict[str, Any]:
    return {
        "pillar": planned.pillar,
        "scenario": planned.scenario,
        "prompt_index": planned.prompt_index,
        "replica": planned.replica,
        "mutation_type": planned.mutation_type or "",
        "invariant": planned.isolated_invariant or "",
    }


def select_planned(
    plan: list[PlannedExecution], selection: list[dict[str, Any]] | None
) -> list[PlannedExecution]:
    """The planned executions the selection keeps (all of them when there is none)."""
    if not selection:
        return list(plan)
    kept = []
    for planned in plan:
        fields = _selector_fields(planned)
        if any(all(fields[k] == v for k, v in selector.items()) for selector in selection):
            kept.append(planned)
    return kept
