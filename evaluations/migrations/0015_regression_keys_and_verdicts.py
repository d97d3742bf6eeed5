from typing import Any

from django.db import migrations, models
from django.db.models.fields.json import KeyTransform

BATCH = 200  # rows read and written at a time: a summary's groups and matrix are ~26 kB

# Copies of selectors.regressions' group_key, groups_by_key, cells_by_key, group_passed,
# summary_failing_keys and compared_verdicts as they were when this migration was written
# (a migration must not change when the app's code does).


def group_key(group: dict[str, Any]) -> str:
    if group.get("key"):
        return str(group["key"])
    label = f"{group.get('scenario', 'no-chaos')} / prompt {group.get('prompt_index', 0)}"
    if group.get("mutation_type"):
        label += f" / {group['mutation_type']}"
    pillar = group.get("pillar") or "contract"
    return label if pillar in ("contract", "chaos") else f"{pillar}: {label}"


def groups_by_key(groups: Any) -> dict[str, dict[str, Any]]:
    if isinstance(groups, dict):
        return {str(k): {"key": str(k), **v} for k, v in groups.items() if isinstance(v, dict)}
    if isinstance(groups, list):
        return {group_key(g): g for g in groups if isinstance(g, dict)}
    return {}


def cells_by_key(matrix: Any) -> dict[str, dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = {}
    for cell in matrix if isinstance(matrix, list) else []:
        if not isinstance(cell, dict) or not cell.get("invariant_id"):
            continue
        passed, total = cell.get("results_passed"), cell.get("results_total")
        counts = {}
        if isinstance(passed, int) and isinstance(total, int) and total:
            counts = {"c": passed, "n": total, "pass_rate": passed / total}
        cells[f"{cell['invariant_id']} @ {cell.get('scenario', '')}"] = {**cell, **counts}
    return cells


def pass_rate(group: dict[str, Any]) -> float | None:
    for name in ("pass_rate", "pass_at_1"):
        if isinstance(group.get(name), int | float):
            return float(group[name])
    return None


def group_passed(group: dict[str, Any]) -> bool:
    if "passed" in group:
        return bool(group["passed"])
    rate = pass_rate(group)
    return rate is not None and rate >= 1.0


COMPARED = ("status", "failure_codes", "c", "n", "invariant_id", "scenario", "prompt_index")


def verdicts(groups: Any, matrix: Any) -> dict[str, list[dict[str, Any]]]:
    def verdict(key: str, item: dict[str, Any]) -> dict[str, Any]:
        entry: dict[str, Any] = {"key": key, "passed": group_passed(item)}
        rate = pass_rate(item)
        if rate is not None:
            entry["pass_rate"] = rate
        entry.update({name: item[name] for name in COMPARED if item.get(name) is not None})
        return entry

    return {
        "groups": [verdict(k, g) for k, g in groups_by_key(groups).items()],
        "cells": [verdict(k, c) for k, c in cells_by_key(matrix).items()],
    }


def failing_keys(compared: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """summary_failing_keys, from the verdicts above (the same groups and cells)."""
    return {part: sorted(v["key"] for v in compared[part] if not v["passed"]) for part in compared}


def backfill(apps: Any, schema_editor: Any) -> None:
    """Every run finalized and every baseline promoted before this migration gets what
    run_finalize and baseline_promote now store, BATCH rows at a time by primary key (only
    the groups and the matrix of a run's summary or a baseline's data are read)."""
    Run = apps.get_model("evaluations", "Run")
    Baseline = apps.get_model("evaluations", "Baseline")
    for model, column in ((Run, "summary"), (Baseline, "data")):
        last = 0
        while True:
            rows = list(
                model.objects.filter(pk__gt=last)
                .order_by("pk")
                .annotate(
                    groups=KeyTransform("groups", column), matrix=KeyTransform("matrix", column)
                )
                .values_list("pk", "groups", "matrix")[:BATCH]
            )
            if not rows:
                break
            last = rows[-1][0]
            changed = [model(pk=pk, verdicts=verdicts(groups, matrix)) for pk, groups, matrix in rows if groups or matrix]
            if model is Run:
                for row in changed:
                    row.failing_keys = failing_keys(row.verdicts)
            model.objects.bulk_update(
                changed, ["verdicts", "failing_keys"] if model is Run else ["verdicts"]
            )


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0014_reviewitem_filter_idx"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="failing_keys",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="run",
            name="verdicts",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="baseline",
            name="verdicts",
            field=models.JSONField(blank=True, default=dict),
        ),
        # Going back drops the columns (AddField reversed): nothing to undo here.
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
