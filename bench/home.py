"""Where a benchmark keeps its KEYSTONE_HOME, so that it measures the local sandbox as a root
installation runs it: each execution's agent as a uid of its own (KEYSTONE_LOCAL_UIDS,
evaluations/runner/as_uid.py). That needs a home those uids can traverse. A directory from
`tempfile.mkdtemp` is its owner's only, and the sandbox then falls back to running the agent
as root, the worker's own user, with a warning: a weaker isolation, whose figures are not
the default's."""

from __future__ import annotations

import tempfile
from pathlib import Path

# What Keystone says (a run warning, printed by `keystone run`) when it ran the agents as
# root because their own uids could not reach the workspace.
RAN_AS_ROOT = "the local backend runs the agent as root"


def traversable_tmpdir(prefix: str) -> Path:
    """A new temporary directory that other users can traverse (not list or write)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path
