"""Issue 19: every environment variable Keystone reads is in the README's Configuration table.

The readers are found in the source, not listed here: `env_*("NAME")` and `os.environ` reads
in keystone_web/, evaluations/ and checks/, the test fixtures' own settings, and `${NAME:-...}`
in tests/run.sh. The variables Keystone sets *for an agent* (`KEYSTONE_OUTPUT`, ...) and reads
back inside the agent host are the agent's contract (docs/), not configuration."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON_READ = re.compile(
    r"""(?:\benv_\w+|os\.environ\.get|os\.getenv)\(\s*"([A-Z][A-Z0-9_]+)"|os\.environ\["([A-Z][A-Z0-9_]+)"\]"""
)
SHELL_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]+):-")
# Set by Keystone for the agent it runs, read back by the agent host (python_agent_host.py).
AGENT_CONTRACT = {"KEYSTONE_AGENT_RESULT", "KEYSTONE_OUTPUT", "KEYSTONE_PROXY_URL"}
FIXTURES = ["tests/conftest.py", "tests/browser/conftest.py"]


def variables_read() -> set[str]:
    files = [
        path
        for package in ("keystone_web", "evaluations", "checks")
        for path in (REPO / package).rglob("*.py")
    ] + [REPO / name for name in FIXTURES]
    names: set[str] = set()
    for path in files:
        for match in PYTHON_READ.finditer(path.read_text(encoding="utf-8")):
            names.add(match.group(1) or match.group(2))
    names |= set(SHELL_READ.findall((REPO / "tests" / "run.sh").read_text(encoding="utf-8")))
    return names - AGENT_CONTRACT


def readme_table() -> set[str]:
    """First-column names of the Configuration table; `A_B_C`, `_D` means `A_B_C` and `A_B_D`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        tokens = re.findall(r"`([A-Z_][A-Z0-9_]*)`", cell)
        for token in tokens:
            if token.startswith("_"):
                prefix = "_".join(tokens[0].split("_")[:2])
                names.add(prefix + token)
            else:
                names.add(token)
    return names


def test_the_scan_finds_the_readers_it_must() -> None:
    found = variables_read()
    # One of each kind of reader: settings, a plain os.environ read, a fixture, run.sh.
    assert {"DATABASE_URL", "NO_COLOR", "KEYSTONE_TEST_BROKER_URL", "TEST_DATABASE_URL"} <= found
    assert "KEYSTONE_POLICY_ALLOWED_SECRETS" in readme_table()  # a `_SUFFIX` row expands


def test_every_environment_variable_the_code_reads_is_in_the_readme_table() -> None:
    missing = sorted(variables_read() - readme_table())
    assert missing == [], f"add these to README.md's Configuration table: {missing}"
