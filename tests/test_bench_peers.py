"""bench/peers compares Keystone and Flakestorm on the same job: the two tools' files must
describe the same prompts, invariants and scenarios (the benchmark itself needs Flakestorm
installed from the package registry and a minute, so it is not a test; see
bench/peers/run_peers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

PEERS = Path(__file__).resolve().parents[1] / "bench" / "peers"


def _load(name: str) -> dict:
    return yaml.safe_load((PEERS / name).read_text())


@pytest.mark.parametrize("job", ["job", "ref001"])
def test_keystone_and_flakestorm_files_describe_the_same_job(job: str) -> None:
    keystone = _load(f"keystone-{job}.yaml")
    flakestorm = _load(f"flakestorm-{job}.yaml")
    task = keystone["task"]
    assert task.get("prompts", [task.get("prompt")]) == flakestorm["golden_prompts"]
    assert keystone["contract"]["invariants"] == flakestorm["contract"]["invariants"]
    assert keystone["contract"]["chaos_matrix"] == flakestorm["contract"]["chaos_matrix"]
    # Both call the agent run_peers.py starts (it fills in the port).
    assert keystone["agent"]["endpoint"] == flakestorm["agent"]["endpoint"]
    assert "AGENT_PORT" in keystone["agent"]["endpoint"]


def test_the_job_is_ten_invariants_by_ten_scenarios_by_five_prompts() -> None:
    keystone = _load("keystone-job.yaml")
    assert len(keystone["contract"]["invariants"]) == 10
    assert len(keystone["contract"]["chaos_matrix"]) == 10
    assert len(keystone["task"]["prompts"]) == 5
    # One agent call per invariant x scenario x prompt, as Flakestorm's contract engine makes.
    assert keystone["isolation"] == "per_invariant"


@pytest.mark.parametrize("job", ["job", "ref001"])
def test_the_keystone_specs_are_valid(job: str) -> None:
    from checks.spec import validate_spec_text

    text = (PEERS / f"keystone-{job}.yaml").read_text().replace("AGENT_PORT", "8000")
    _, errors = validate_spec_text(text)
    assert errors == []
