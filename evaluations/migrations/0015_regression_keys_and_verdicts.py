from typing import Any

from django.db import migrations, models
from django.db.models.fields.json import KeyTransform

BATCH = 200  # runs read and written at a time: each summary's groups and matrix are ~26 kB

# Copies of selectors.regressions' group_key, groups_by_key, cells_by_key, group_passed and
# summary_failing_keys as they were when this migration was written (a migration must not
# change when the app's code does).


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


def group_passed(group: dict[str, Any]) -> bool:
    if "passed" in group:
        return bool(group["passed"])
    for name in ("pass_rate", "pass_at_1"):
        if isinstance(group.get(name), int | float):
            return float(group[name]) >= 1.0
    return False


def failing_keys(groups: Any, matrix: Any) -> dict[str, list[str]]:
    return {
        "groups": sorted(k for k, g in groups_by_key(groups).items() if not group_passed(g)),
        "cells": sorted(k for k, c in cells_by_key(matrix).items() if not group_passed(c)),
    }


def backfill(apps: Any, schema_editor: Any) -> None:
    """Every run finalized before this migration gets the keys run_finalize now stores,
    BATCH runs at a time by primary key (only the summary's groups and matrix are read)."""
    Run = apps.get_model("evaluations", "Run")
    last = 0
    while True:
        rows = list(
            Run.objects.filter(pk__gt=last)
            .order_by("pk")
            .annotate(
                groups=KeyTransform("groups", "summary"), matrix=KeyTransform("matrix", "summary")
            )
            .values_list("pk", "groups", "matrix")[:BATCH]
        )
        if not rows:
            return
        last = rows[-1][0]
        changed = [
            Run(pk=pk, failing_keys=failing_keys(groups, matrix))
            for pk, groups, matrix in rows
            if groups or matrix
        ]
        Run.objects.bulk_update(changed, ["failing_keys"])


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
        # Going back drops the column (AddField reversed): nothing to undo here.
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
