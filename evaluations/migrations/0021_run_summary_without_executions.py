from django.db import migrations

# A run's stored summary no longer keeps each execution's score (run_finalize stores
# RunSummary.to_dict(per_execution=False)): the executions keep their own rows, with their
# results, and a report or an export scores them again. The runs finished before lose the
# list here, in one statement: nothing read it, and it was 95 % of a large run's summary.
# Nothing is lost that the stored rows do not hold.
STRIP = {
    "postgresql": (
        "UPDATE evaluations_run SET summary = summary - 'executions' "
        "WHERE summary -> 'executions' IS NOT NULL"
    ),
    "sqlite": (
        "UPDATE evaluations_run SET summary = json_remove(summary, '$.executions') "
        "WHERE json_type(summary, '$.executions') IS NOT NULL"
    ),
}


def strip_executions(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(STRIP[connection.vendor])


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0020_covered_foreign_key_indexes"),
    ]

    operations = [
        # Backwards there is nothing to do: the code before this never read the list.
        migrations.RunPython(strip_executions, migrations.RunPython.noop),
    ]
