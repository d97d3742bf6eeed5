from typing import Any

from django.db import migrations, models


def mark_versions_read_from_files(apps: Any, schema_editor: Any) -> None:
    """Until now a version read from a file (the CLI, the demo) had a directory and no author;
    one typed in the browser as a new version of it had both."""
    versions = apps.get_model("evaluations", "SpecVersion")
    versions.objects.exclude(base_dir="").filter(author__isnull=True).update(read_from_files=True)


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0015_regression_keys_and_verdicts"),
    ]

    operations = [
        migrations.AddField(
            model_name="specversion",
            name="read_from_files",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_versions_read_from_files, migrations.RunPython.noop),
    ]
