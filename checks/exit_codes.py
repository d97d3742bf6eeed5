"""The exit codes of `keystone` (docs/scoring.md), in a module of their own so a command can
name them without importing the engine."""

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_SPEC_INVALID = 2
EXIT_PROVIDER_ERROR = 3
EXIT_INTERNAL_ERROR = 4


class CommandFailed(Exception):
    """A command cannot go on for a reason it explains in one line (a database not set up,
    say): `keystone` prints the message, not a traceback or "internal error", and exits with
    `code`."""

    def __init__(self, message: str, code: int = EXIT_INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.code = code
