from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

BATCH = 5000  # completed review items read at a time


def tally_key_and_counts(item: dict[str, Any]) -> tuple[tuple[Any, ...], list[float]] | None:
    """A copy of what evaluations.models.ReviewAgreementDay.tally counts for one item, as it
    was when this migration was written (a migration must not change when the app's code
    does): its row's key, and [both pass, both fail, judge pass human fail, judge fail human
    pass, absolute error, scored]; None when the item does not count for agreement."""
    if item["judge_passed"] is None or item["final_passed"] is None or not item["judge_model"]:
        return None
    day = timezone.localdate(item["completed"] or timezone.now())
    key = (
        item["project_id"],
        item["spec_id"],
        item["judge_model"],
        item["criteria"],
        item["prompt_version"],
        day,
    )
    counts = [0.0] * 6
    if item["judge_passed"]:
        counts[0 if item["final_passed"] else 2] = 1
    else:
        counts[3 if item["final_passed"] else 1] = 1
    if item["judge_score"] is not None and item["final_score"] is not None:
        counts[4] = abs(item["judge_score"] - item["final_score"])
        counts[5] = 1
    return key, counts


def backfill(apps: Any, schema_editor: Any) -> None:
    """The daily tallies of every item completed before this migration, BATCH items at a
    time by primary key, written once at the end (a few rows per spec and day)."""
    ReviewItem = apps.get_model("evaluations", "ReviewItem")
    ReviewAgreementDay = apps.get_model("evaluations", "ReviewAgreementDay")
    fields = [
        "pk", "project_id", "spec_id", "judge_model", "criteria", "prompt_version",
        "completed", "judge_passed", "final_passed", "judge_score", "final_score",
    ]  # fmt: skip
    tallies: dict[tuple[Any, ...], list[float]] = {}
    last = 0
    while True:
        items = list(
            ReviewItem.objects.filter(pk__gt=last, status="complete")
            .order_by("pk")
            .values(*fields)[:BATCH]
        )
        if not items:
            break
        last = items[-1]["pk"]
        for item in items:
            counted = tally_key_and_counts(item)
            if counted is not None:
                key, counts = counted
                sums = tallies.setdefault(key, [0.0] * 6)
                for index, value in enumerate(counts):
                    sums[index] += value
    ReviewAgreementDay.objects.bulk_create(
        [
            ReviewAgreementDay(
                project_id=project_id,
                spec_id=spec_id,
                judge_model=judge_model,
                criteria=criteria,
                prompt_version=prompt_version,
                day=day,
                both_pass=int(sums[0]),
                both_fail=int(sums[1]),
                judge_pass_human_fail=int(sums[2]),
                judge_fail_human_pass=int(sums[3]),
                absolute_error=sums[4],
                scored=int(sums[5]),
            )
            for (project_id, spec_id, judge_model, criteria, prompt_version, day), sums in (
                tallies.items()
            )
        ],
        batch_size=1000,
    )


class Migration(migrations.Migration):

    dependencies = [
        ('evaluations', '0012_run_invariant_counts'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReviewAgreementDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('judge_model', models.CharField(max_length=200)),
                ('criteria', models.TextField(blank=True, default='')),
                ('prompt_version', models.CharField(blank=True, default='', max_length=64)),
                ('day', models.DateField()),
                ('both_pass', models.IntegerField(default=0)),
                ('both_fail', models.IntegerField(default=0)),
                ('judge_pass_human_fail', models.IntegerField(default=0)),
                ('judge_fail_human_pass', models.IntegerField(default=0)),
                ('absolute_error', models.FloatField(default=0.0)),
                ('scored', models.IntegerField(default=0)),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='evaluations.project')),
                ('spec', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='evaluations.spec')),
            ],
            options={
                'indexes': [models.Index(fields=['project', 'spec', 'day'], name='agreementday_idx')],
            },
        ),
        # Going back drops the table (CreateModel reversed): nothing to undo here.
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
