"""The example specs: all valid, and together they use every block of the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from checks.spec import load_spec_file, spec_schema
from checks.spec.schema import compiled_validator

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples" / "specs").glob("*.yaml"))


def _examples_data() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text(encoding="utf-8")) for p in EXAMPLES]


@pytest.mark.parametrize("spec_file", EXAMPLES, ids=lambda p: p.stem)
def test_example_spec_parses(spec_file: Path) -> None:
    spec = load_spec_file(spec_file)
    assert spec.id == spec_file.stem
    assert spec.prompts and spec.invariants


@pytest.mark.parametrize("spec_file", EXAMPLES, ids=lambda p: p.stem)
def test_example_spec_is_valid_under_the_published_schema(spec_file: Path) -> None:
    # The validator splits the schema for speed; plain jsonschema on the file must agree.
    data = yaml.safe_load(spec_file.read_text(encoding="utf-8"))
    assert list(compiled_validator().iter_errors(data)) == []


def test_published_schema_is_valid_draft_2020_12_and_rejects_unknown_check_fields() -> None:
    schema = spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = yaml.safe_load(EXAMPLES[0].read_text(encoding="utf-8"))
    first = next(iter(data["invariants"].values()))
    first["check"]["no_such_field"] = 1
    assert not jsonschema.Draft202012Validator(schema).is_valid(data)


def test_there_are_at_least_four_examples_including_the_finance_contract() -> None:
    assert len(EXAMPLES) >= 4
    assert "finance-agent" in [p.stem for p in EXAMPLES]


def test_examples_use_every_top_level_block() -> None:
    used = set().union(*(d.keys() for d in _examples_data()))
    assert set(spec_schema()["properties"]) - used == set()


def test_examples_use_both_task_forms_and_every_agent_service_and_provider_kind() -> None:
    data = _examples_data()
    assert {form for d in data for form in d["task"]} == {"prompt", "prompts"}
    assert {d["agent"]["type"] for d in data} == {"command", "http", "python"}
    assert {s["type"] for d in data for s in d.get("services", [])} == {
        "postgres",
        "mysql",
        "sqlite",
        "http_mock",
    }
    assert {d["llm"]["provider"] for d in data if "llm" in d} == {"openai", "scripted"}
    assert {d["judge"]["provider"] for d in data if "judge" in d} == {"openai", "scripted"}
    backends = {d["sandbox"].get("backend") for d in data if "sandbox" in d}
    # No example asks for `local`: the default server policy refuses it where bubblewrap works.
    assert backends - {None} == {"bwrap", "docker"}


def test_examples_use_every_check_type() -> None:
    used = {inv["check"]["type"] for d in _examples_data() for inv in d["invariants"].values()}
    all_types = set(spec_schema()["$defs"]["check"]["properties"]["type"]["enum"])
    assert all_types - used == set()


def test_examples_use_every_fault_mode_attack_and_profile() -> None:
    defs = spec_schema()["$defs"]
    scenarios = [s for d in _examples_data() for s in d.get("chaos_matrix", [])]
    tool_modes = {f["mode"] for s in scenarios for f in s.get("tool_faults", [])}
    llm_modes = {f["mode"] for s in scenarios for f in s.get("llm_faults", [])}
    drift_types = {
        f["drift_type"] for s in scenarios for f in s.get("llm_faults", []) if "drift_type" in f
    }
    attacks = {a["type"] for s in scenarios for a in s.get("context_attacks", [])}
    profiles = {s["profile"] for s in scenarios if "profile" in s}
    assert tool_modes == set(defs["tool_fault"]["properties"]["mode"]["enum"])
    assert llm_modes == set(defs["llm_fault"]["properties"]["mode"]["enum"])
    assert drift_types == set(defs["llm_fault"]["properties"]["drift_type"]["enum"])
    assert attacks == set(defs["context_attack"]["properties"]["type"]["enum"])
    assert profiles == set(defs["scenario_profile"]["properties"]["profile"]["enum"])


def test_examples_use_all_three_replay_session_forms() -> None:
    sessions = [s for d in _examples_data() for s in d.get("replay", {}).get("sessions", [])]
    assert any("file" in s for s in sessions)
    # `execution: N` names an execution of one server: no example that runs anywhere uses it.
    assert any("input" in s for s in sessions)


def test_mutation_types_are_the_24_flakestorm_names() -> None:
    types = spec_schema()["$defs"]["mutations"]["properties"]["types"]["items"]["enum"]
    assert len(types) == 24 == len(set(types))
    for name in (
        "paraphrase",
        "noise",
        "tone_shift",
        "prompt_injection",
        "encoding_attacks",
        "length_extremes",
        "context_manipulation",
        "language_mixing",
    ):
        assert name in types
