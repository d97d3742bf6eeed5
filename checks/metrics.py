"""The single figures of a run that `keystone score --metric` prints, in a module of their
own so the command line can list them (argparse choices) without importing the report
model and its dataclasses at start-up."""

PILLAR_METRICS = ("contract", "chaos", "mutation", "replay")
# The single figures `keystone score --metric` prints; resilience is 0-100, as Flakestorm's.
SUMMARY_METRICS = (
    "resilience",
    "overall",
    "pass_rate",
    *PILLAR_METRICS,
    "judge_mean",
    "cost_usd",
    "p95_duration_ms",
)


def format_metric(name: str, value: float) -> str:
    if name == "resilience":
        return f"{value:.1f}"
    if name == "cost_usd":
        return f"{value:.6f}"
    if name == "p95_duration_ms":
        return f"{value:.0f}"
    return f"{value:.3f}"
