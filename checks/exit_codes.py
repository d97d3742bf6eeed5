"""The exit codes of `keystone` (docs/scoring.md), in a module of their own so a command can
name them without importing the engine."""

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_SPEC_INVALID = 2
EXIT_PROVIDER_ERROR = 3
EXIT_INTERNAL_ERROR = 4
