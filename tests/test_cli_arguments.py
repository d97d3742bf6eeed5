"""A number given to a `keystone` option that no run can use is a usage error (exit 2) that
names the option, what it expects and what it got: `--jobs 0`, `--replicas -1` and
`--timeout -5` used to run anyway (the default jobs, a run that was not the one asked for,
a run cancelled at once)."""

from __future__ import annotations

import pytest

from checks.exit_codes import EXIT_SPEC_INVALID
from evaluations.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "s.yaml", "--jobs", "0"],
            "--jobs: expected a whole number of at least 1, got '0'",
        ),
        (["run", "s.yaml", "--jobs", "two"], "--jobs: expected a whole number of at least 1"),
        (["run", "s.yaml", "--processes", "-1"], "--processes: expected a whole number of at"),
        (["run", "s.yaml", "--replicas", "0"], "--replicas: expected a whole number of at least"),
        (["run", "s.yaml", "--replicas", "1.5"], "--replicas: expected a whole number"),
        (["run", "s.yaml", "--timeout", "-5"], "--timeout: expected a number of seconds above 0"),
        (["run", "s.yaml", "--timeout", "nan"], "--timeout: expected a number of seconds"),
        (["worker", "--concurrency", "0"], "--concurrency: expected a whole number of at least"),
        (["compare", "3", "--alpha", "1"], "--alpha: expected a significance level between 0"),
        (["score", "r.json", "--kappa", "1.2"], "--kappa: expected a kappa from -1 to 1"),
        (["serve", "--port", "70000"], "--port: expected a port from 1 to 65535, got '70000'"),
    ],
)
def test_an_unusable_number_is_a_usage_error_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_SPEC_INVALID
    assert message in capsys.readouterr().err


def test_usable_numbers_are_taken_as_numbers() -> None:
    args = build_parser().parse_args(
        ["run", "s.yaml", "--jobs", "3", "--processes", "1", "--replicas", "2", "--timeout", "1.5"]
    )
    assert (args.jobs, args.processes, args.replicas, args.timeout) == (3, 1, 2, 1.5)
    compare = build_parser().parse_args(["compare", "3", "--alpha", "0.01"])
    assert compare.alpha == 0.01
