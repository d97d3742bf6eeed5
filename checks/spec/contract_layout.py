"""Reference 001's literal layout, `contract: {invariants: [...], chaos_matrix: [...]}`, read
as an alias of Keystone's map form before validation.

001 lists invariants with an `id` and the check's fields inline:

    contract:
      name: "Finance Agent Contract"
      invariants:
        - {id: always-cite-source, type: regex, pattern: "...", severity: critical}
      chaos_matrix: [...]

which is the same as

    description: "Finance Agent Contract"
    invariants:
      always-cite-source:
        description: always-cite-source
        severity: critical
        check: {type: regex, pattern: "..."}
    chaos_matrix: [...]

The positions of the rewritten fields move with them, so every later error still points at
the line the author wrote.
"""

from __future__ import annotations

from typing import Any

from checks.spec.loader import LoadedYaml, Path
from checks.spec.schema import Problem

# The invariant's own fields (the `invariant` schema); everything else belongs to its check.
INVARIANT_FIELDS = frozenset(
    {"description", "weight", "gate", "severity", "when", "negate", "dimensions", "probes"}
)
CONTRACT_FIELDS = ("name", "description", "invariants", "chaos_matrix")


def unfold_contract(loaded: LoadedYaml) -> list[Problem]:
    """Rewrite a `contract` block in `loaded.data` (and its positions) into the map form.
    Problems when the block cannot be read that way; the data is then left as it was."""
    data = loaded.data
    if not isinstance(data, dict) or "contract" not in data:
        return []
    contract = data["contract"]
    where: Path = ("contract",)
    if not isinstance(contract, dict):
        return [Problem(where, "contract must be a mapping with invariants and chaos_matrix")]
    problems = [
        Problem(
            (*where, key),
            f"unknown field '{key}' in contract (use {', '.join(CONTRACT_FIELDS)})",
            at_key=True,
        )
        for key in contract
        if key not in CONTRACT_FIELDS
    ]
    problems += [
        Problem(
            (*where, key),
            f"'{key}' is given both in contract and at the top level: write it once",
            at_key=True,
        )
        for key in ("invariants", "chaos_matrix")
        if key in contract and key in data
    ]
    listed = contract.get("invariants", [])
    if not isinstance(listed, list):
        problems.append(
            Problem(
                (*where, "invariants"),
                "contract.invariants must be a list of invariants, each with an id",
            )
        )
        listed = []
    moves: dict[Path, Path] = {}
    invariants: dict[str, Any] = {}
    for index, item in enumerate(listed):
        at = (*where, "invariants", index)
        ident = item.get("id") if isinstance(item, dict) else None
        if not isinstance(ident, str) or not ident:
            problems.append(Problem(at, "each contract invariant needs an id (a string)"))
            continue
        if ident in invariants:
            problems.append(Problem((*at, "id"), f"duplicate invariant id '{ident}'"))
            continue
        invariant: dict[str, Any] = {"description": ident}  # 001 makes description optional
        check: dict[str, Any] = {}
        moves[at] = ("invariants", ident)
        for key, value in item.items():
            if key == "id":
                continue
            if key in INVARIANT_FIELDS:
                invariant[key] = value
                moves[(*at, key)] = ("invariants", ident, key)
            else:
                check[key] = value
                moves[(*at, key)] = ("invariants", ident, "check", key)
        invariant["check"] = check
        invariants[ident] = invariant
    if problems:
        return problems

    del data["contract"]
    if "invariants" in contract:
        data["invariants"] = invariants
    if "chaos_matrix" in contract:
        data["chaos_matrix"] = contract["chaos_matrix"]
        moves[(*where, "chaos_matrix")] = ("chaos_matrix",)
    title = " - ".join(str(contract[k]) for k in ("name", "description") if contract.get(k))
    if title and "description" not in data:
        data["description"] = title
    _move_marks(loaded, moves)
    return []


def _move_marks(loaded: LoadedYaml, moves: dict[Path, Path]) -> None:
    """Positions under each old prefix, re-keyed under its new one (the longest prefix wins)."""
    for marks in (loaded.value_marks, loaded.key_marks):
        for path in [p for p in marks if p[:1] == ("contract",)]:
            for cut in range(len(path), 0, -1):
                target = moves.get(path[:cut])
                if target is not None:
                    marks[(*target, *path[cut:])] = marks[path]
                    break
