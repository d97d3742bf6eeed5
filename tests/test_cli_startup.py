"""Issue 18: what a `keystone` command pays before it does its work. `keystone run` migrates
the embedded database only when a migration is pending, and django.setup() does not import
the web API's libraries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from evaluations.cli_commands import migrations_pending
from tests.cli_helpers import REPO_ROOT, embedded_env

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def test_no_migration_is_pending_on_a_migrated_database() -> None:
    assert not migrations_pending()


def test_a_migration_file_not_recorded_as_applied_is_pending() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = %s AND name = %s",
            ["evaluations", "0001_initial"],
        )
    assert migrations_pending()


def test_django_setup_imports_neither_ninja_nor_pydantic(tmp_path: Path) -> None:
    """/api/docs serves ninja's files by path (settings): no CLI command pays for ninja."""
    code = (
        "import os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'keystone_web.settings'\n"
        "import django; django.setup()\n"
        "print(sorted(m for m in ('ninja', 'pydantic') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=embedded_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
