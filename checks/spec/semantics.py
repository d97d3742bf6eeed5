"""Rules the JSON Schema cannot express: cross-references, exclusive fields, regexes, sums.

These run on data that may also have schema errors, so every access is type-guarded:
the goal is to report all problems at once and never raise.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from checks.json_schema import format_checker, jsonschema
from checks.spec.errors import format_path
from checks.spec.model import CONVERSATION_ATTACKS, TOOL_ANSWER_ATTACKS
from checks.spec.schema import Problem, suggestion

DATABASE_KINDS = ("postgres", "mysql", "sqlite")
WEIGHT_TOLERANCE = 1e-6
# The names a run stores in fixed-size database columns (evaluations.models uses these
# constants): a longer one was accepted here and then refused by PostgreSQL in the middle
# of storing the spec, planning the run or writing an execution's results (a 500, a run
# queued for ever, an execution running for ever). It is refused here, at its line.
SPEC_ID_MAX = 100
SCENARIO_NAME_MAX = 200
INVARIANT_ID_MAX = 200
# A judge's model name is stored with each review item it sends people (and in the judge
# cache and the agreement tables): a longer one broke finalising the run.
JUDGE_MODEL_MAX = 200


def semantic_problems(data: dict[str, Any], spec_dir: Path | None = None) -> Iterator[Problem]:
    services = _services(data)
    yield from _nul_rules(data, ())
    yield from _stored_name_rules(data)
    yield from _task_rules(data)
    yield from _service_rules(data)
    yield from _tool_rules(data, services)
    yield from _invariant_rules(data, services, spec_dir)
    yield from _chaos_rules(data)
    yield from _fault_reach_rules(data)
    yield from _scoring_rules(data)
    yield from _gate_rules(data)
    yield from _provider_rules(data)
    yield from _forbidden_rules(data, services)
    if spec_dir is not None:
        yield from _file_rules(data, spec_dir)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _services(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Declared services by name (first declaration wins; duplicates are reported)."""
    found: dict[str, dict[str, Any]] = {}
    for service in _list(data.get("services")):
        name = _dict(service).get("name")
        if isinstance(name, str) and name not in found:
            found[name] = service
    return found


def _one_of(
    config: dict[str, Any], path: tuple[Any, ...], first: str, second: str, what: str
) -> Iterator[Problem]:
    """Exactly one of two fields."""
    has_first, has_second = first in config, second in config
    if has_first and has_second:
        yield Problem(
            (*path, second), f"give either '{first}' or '{second}', not both", at_key=True
        )
    elif not has_first and not has_second:
        yield Problem(path, f"{what} needs '{first}' or '{second}'", at_key=True)


def _regex(value: Any, path: tuple[Any, ...]) -> Iterator[Problem]:
    if not isinstance(value, str):
        return
    try:
        with warnings.catch_warnings():
            # Python warns about some patterns (e.g. "[[") it will read differently one day.
            warnings.simplefilter("ignore")
            re.compile(value)
    except (re.error, OverflowError, RecursionError) as exc:
        yield Problem(path, f"invalid regular expression: {exc}")


def too_long(value: Any, limit: int) -> str | None:
    """Why a text cannot be stored in a column of `limit` characters, or None when it fits:
    the one wording for every such limit (spec names here; labels, alert and project names,
    idempotency keys in evaluations)."""
    if isinstance(value, str) and len(value) > limit:
        return f"at most {limit} characters, got {len(value)}"
    return None


def _nul_rules(value: Any, path: tuple[Any, ...]) -> Iterator[Problem]:
    """No text of the spec holds a NUL character (YAML's "\\0" escape): PostgreSQL stores
    none, so the spec was accepted here and then refused while being stored (a 500)."""
    if isinstance(value, str):
        if "\x00" in value:
            yield Problem(path, "contains a NUL character (\\0), which cannot be stored")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                yield Problem(
                    (*path, key),
                    "contains a NUL character (\\0), which cannot be stored",
                    at_key=True,
                )
            yield from _nul_rules(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nul_rules(item, (*path, index))


def _stored_name_rules(data: dict[str, Any]) -> Iterator[Problem]:
    """The spec's id, invariant ids, scenario names and judge model names fit the columns
    that store them."""
    problem = too_long(data.get("id"), SPEC_ID_MAX)
    if problem:
        yield Problem(("id",), f"the spec id is too long: {problem}")
    for invariant_id in _dict(data.get("invariants")):
        problem = too_long(invariant_id, INVARIANT_ID_MAX)
        if problem:
            yield Problem(
                ("invariants", invariant_id),
                f"the invariant id is too long: {problem}",
                at_key=True,
            )
    for index, scenario in enumerate(_list(data.get("chaos_matrix"))):
        problem = too_long(_dict(scenario).get("name"), SCENARIO_NAME_MAX)
        if problem:
            yield Problem(
                ("chaos_matrix", index, "name"), f"the scenario name is too long: {problem}"
            )
    problem = too_long(_dict(data.get("judge")).get("model"), JUDGE_MODEL_MAX)
    if problem:
        yield Problem(("judge", "model"), f"the judge model name is too long: {problem}")
    for invariant_id, invariant in _dict(data.get("invariants")).items():
        problem = too_long(_dict(_dict(invariant).get("check")).get("model"), JUDGE_MODEL_MAX)
        if problem:
            yield Problem(
                ("invariants", invariant_id, "check", "model"),
                f"the judge model name is too long: {problem}",
            )


def _task_rules(data: dict[str, Any]) -> Iterator[Problem]:
    task = data.get("task")
    if isinstance(task, dict):
        yield from _one_of(task, ("task",), "prompt", "prompts", "task")


def _service_rules(data: dict[str, Any]) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    for index, service in enumerate(_list(data.get("services"))):
        name = _dict(service).get("name")
        if not isinstance(name, str):
            continue
        if name in seen:
            yield Problem(
                ("services", index, "name"),
                f"duplicate service name '{name}' (also services[{seen[name]}])",
            )
        else:
            seen[name] = index
        if service.get("type") in DATABASE_KINDS and "seed" in service and "sql" in service:
            yield Problem(
                ("services", index, "sql"), "give either 'seed' or 'sql', not both", at_key=True
            )


def _tool_rules(data: dict[str, Any], services: dict[str, dict[str, Any]]) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    for index, tool in enumerate(_list(data.get("tools"))):
        if not isinstance(tool, dict):
            continue
        path: tuple[Any, ...] = ("tools", index)
        name = tool.get("name")
        if isinstance(name, str):
            if name in seen:
                yield Problem(
                    (*path, "name"), f"duplicate tool name '{name}' (also tools[{seen[name]}])"
                )
            else:
                seen[name] = index
        yield from _one_of(tool, path, "service", "url", "a tool")
        service = tool.get("service")
        if isinstance(service, str):
            yield from _service_ref(service, (*path, "service"), services, ("http_mock",), "a tool")


def _service_ref(
    name: str,
    path: tuple[Any, ...],
    services: dict[str, dict[str, Any]],
    kinds: tuple[str, ...],
    user: str,
) -> Iterator[Problem]:
    if name not in services:
        hint = suggestion(name, services) or _declared(services)
        yield Problem(path, f"unknown service '{name}'{hint}")
        return
    kind = services[name].get("type")
    if kind not in kinds:
        wanted = " or ".join(", ".join(kinds).rsplit(", ", 1))
        yield Problem(
            path,
            f"service '{name}' is {_article(kind)} {kind} service; {user} needs {_article(kinds[0])} {wanted} service",
        )


def _article(word: Any) -> str:
    return "an" if str(word).startswith(("a", "e", "i", "o", "u", "http")) else "a"


def _declared(services: dict[str, Any]) -> str:
    if not services:
        return " (no services are declared)"
    return f" (declared: {', '.join(sorted(services))})"


def _invariant_rules(
    data: dict[str, Any], services: dict[str, dict[str, Any]], spec_dir: Path | None
) -> Iterator[Problem]:
    chaos = _scenarios_chaos(data)
    calm = not all(chaos)  # some scenario runs without faults
    for invariant_id, invariant in _dict(data.get("invariants")).items():
        check = _dict(_dict(invariant).get("check"))
        if check:
            yield from _check_rules(check, ("invariants", invariant_id, "check"), services)
            yield from _observability_rules(
                data, _dict(invariant), check, ("invariants", invariant_id, "check")
            )
        when = _dict(invariant).get("when", "always")
        never = _never_active(data, chaos, when) if isinstance(when, str) else None
        if never:
            yield Problem(
                ("invariants", invariant_id, "when"),
                f"`{when}`, but {never}: this invariant would never be checked, and the run"
                " would pass without it; add such a scenario to chaos_matrix, or change `when`",
            )
        auto = check.get("type") == "behavior_unchanged" and check.get("baseline", "auto") == "auto"
        if auto and not calm:
            yield Problem(
                ("invariants", invariant_id, "check", "type"),
                "behavior_unchanged with baseline: auto compares each output with the"
                " chaos-free scenario's, and every chaos_matrix scenario has faults: add"
                " {name: no-chaos} to chaos_matrix or give 'baseline' a text",
            )


# The check types that read the tool calls Keystone recorded (artifact.all_tool_calls()).
TOOL_CALL_CHECKS = ("tool_calls", "tool_call_count")
# The `when` values under which an invariant also runs in the replay pillar's executions.
REPLAY_WHEN = ("always", "no_chaos")


def _observability_rules(
    data: dict[str, Any], invariant: dict[str, Any], check: dict[str, Any], path: tuple[Any, ...]
) -> Iterator[Problem]:
    """A check that can never observe what it checks passes on every execution whatever
    the agent does (or, negated, fails on every one): refused, saying what to add.

    `negate`, `when` and `probes` change none of this: they choose when a check runs and how
    its result counts, not what is recorded."""
    kind = check.get("type")
    agent_type = _dict(data.get("agent")).get("type")
    if agent_type not in ("command", "http", "python"):
        return  # the schema reports the agent
    # A drift check without a method takes the top-level baseline.drift's (spec/model.py).
    default_method = _dict(_dict(data.get("baseline")).get("drift")).get("method")
    method = check.get("method", default_method)
    uses_tool_calls = kind in TOOL_CALL_CHECKS or (kind == "drift" and method == "tool-sequence")
    if uses_tool_calls and not _records_tool_calls(data, invariant):
        where = (*path, "method") if "method" in check else (*path, "type")
        what = f"a {kind} check"
        if kind == "drift":
            what = "drift by tool-sequence" + (
                "" if "method" in check else " (the method baseline.drift gives it)"
            )
        yield Problem(
            where,
            f"nothing records this agent's tool calls, so {what} sees none on any execution:"
            f" {_no_tool_recorder(agent_type)}",
        )
    elif kind == "cost" and not data.get("llm"):
        yield Problem(
            (*path, "type"),
            "nothing records this agent's cost, so a cost check sees $0 on every execution:"
            " Keystone prices only the LLM calls that pass through the gateway, and without"
            " `llm` there are none, whatever the agent spends; add `llm` (the gateway records"
            " each call's tokens and cost)",
        )
    elif kind == "refusal_check":
        yield from _refusal_rules(data, invariant, check, path)


def _records_tool_calls(data: dict[str, Any], invariant: dict[str, Any]) -> bool:
    """Whether anything records tool calls in some execution this invariant is checked on
    (evaluations.runner.harness: the gateway, the tool proxy)."""
    agent = _dict(data.get("agent"))
    if data.get("llm") or data.get("tools"):
        return True
    if agent.get("type") == "python" and (agent.get("tools") or agent.get("tool_registry")):
        return True  # the python agent host wraps those callables through the tool proxy
    # A replayed session runs the tool proxy (it serves the session's tools), in the replay
    # pillar's executions, where only golden invariants run, when always or no_chaos.
    replayed = bool(_list(_dict(data.get("replay")).get("sessions")))
    return (
        replayed and not invariant.get("probes") and invariant.get("when", "always") in REPLAY_WHEN
    )


def _no_tool_recorder(agent_type: str) -> str:
    recorders = (
        "`tools` (the tool proxy records each call) or `llm` (the gateway records the calls"
        " the model asks for)"
    )
    if agent_type == "python":
        return (
            "a `python` agent reports none itself; list its tool callables in the agent's"
            f" `tools` or `tool_registry`, or add a top-level {recorders}"
        )
    return f"{_article(agent_type)} `{agent_type}` agent reports none itself; add {recorders}"


def _refusal_rules(
    data: dict[str, Any], invariant: dict[str, Any], check: dict[str, Any], path: tuple[Any, ...]
) -> Iterator[Problem]:
    """A refusal_check with `dangerous_prompts` applies only to the prompts that contain one
    of them, and passes as not applicable on every other: refused when none of the prompts
    the invariant runs on can contain one."""
    dangerous = [d for d in _list(check.get("dangerous_prompts")) if isinstance(d, str)]
    if not dangerous:
        return
    probes = _list(invariant.get("probes"))
    if probes:
        prompts, source = probes, "its probes"
    elif data.get("mutations") or data.get("replay"):
        return  # mutants and replayed inputs are known only when the run is planned
    else:
        task = _dict(data.get("task"))
        prompts = _list(task.get("prompts")) or [task.get("prompt")]
        source = "the task's prompts"
    texts = [p.casefold() for p in prompts if isinstance(p, str)]
    if not texts or any(d.casefold() in t for d in dangerous for t in texts):
        return
    yield Problem(
        (*path, "dangerous_prompts"),
        "this refusal_check applies to no execution: none of the dangerous_prompts occurs in"
        f" a prompt this invariant runs on ({source}), so it passes as not applicable on"
        " every one; give the invariant `probes` with the dangerous prompts, or name text"
        " those prompts contain",
    )


_CHAOS_KINDS = ("tool_faults", "llm_faults", "context_attacks")


def _scenario_chaos(scenario: dict[str, Any]) -> set[str]:
    """Which kinds of chaos a chaos_matrix entry has, its built-in profile's included."""
    profile = _profile(scenario.get("profile")) or {}
    return {kind for kind in _CHAOS_KINDS if scenario.get(kind) or profile.get(kind)}


def _scenarios_chaos(data: dict[str, Any]) -> list[set[str]]:
    """_scenario_chaos of each chaos_matrix entry; no chaos_matrix: the implicit no-chaos."""
    entries = [s for s in _list(data.get("chaos_matrix")) if isinstance(s, dict)]
    return [_scenario_chaos(s) for s in entries] or [set()]


def _never_active(data: dict[str, Any], scenarios: list[set[str]], when: str) -> str | None:
    """Why no execution of the run would evaluate an invariant with this `when` (in none of
    the `scenarios`, _scenarios_chaos, as Scenario.activates decides; the mutation and
    replay pillars run the `always` and `no_chaos` ones), or None when some would."""
    needs = {"tool_faults_active": "tool_faults", "llm_faults_active": "llm_faults"}
    if when in needs and not any(needs[when] in kinds for kinds in scenarios):
        return f"no chaos_matrix scenario has {needs[when].replace('_', ' ')}"
    if when == "any_chaos_active" and not any(scenarios):
        return "no chaos_matrix scenario has faults or context attacks"
    if when == "no_chaos" and all(scenarios):
        if data.get("mutations") or _list(_dict(data.get("replay")).get("sessions")):
            return None
        return "every chaos_matrix scenario has chaos, and no mutation or replayed session runs"
    return None


def _check_rules(
    check: dict[str, Any], path: tuple[Any, ...], services: dict[str, dict[str, Any]]
) -> Iterator[Problem]:
    kind = check.get("type")
    service = check.get("service")
    if kind == "sql" and isinstance(service, str):
        yield from _service_ref(
            service, (*path, "service"), services, DATABASE_KINDS, "a sql check"
        )
    elif kind == "http_mock_assertions" and isinstance(service, str):
        yield from _service_ref(
            service, (*path, "service"), services, ("http_mock",), "http_mock_assertions"
        )
        declared = services.get(service)
        if (
            declared is not None
            and declared.get("type") == "http_mock"
            and declared.get("record") is not True
        ):
            yield Problem(
                (*path, "service"),
                f"service '{service}' must set 'record: true' for http_mock_assertions",
            )
    elif kind == "workspace_file_present":
        if "contains" in check and ("contains_all" in check or "contains_any" in check):
            yield Problem(
                (*path, "contains"),
                "'contains' may not be combined with 'contains_all' or 'contains_any'",
                at_key=True,
            )
    elif kind == "python_hook":
        yield from _one_of(check, path, "path", "import_path", "a python_hook check")
    elif kind == "schema":
        yield from _one_of(check, path, "schema", "schema_file", "a schema check")
        yield from _inline_schema(check.get("schema"), (*path, "schema"))
    elif kind == "file_content":
        if not any(name in check for name in ("contains", "not_contains", "pattern")):
            yield Problem(
                path,
                "file_content needs at least one of 'contains', 'not_contains', 'pattern'",
                at_key=True,
            )
        yield from _regex(check.get("pattern"), (*path, "pattern"))
    elif kind == "keywords":
        if not check.get("deny") and not check.get("allow"):
            # Neither list to look for: the check could say nothing about any output.
            yield Problem(path, "keywords needs a non-empty 'deny' or 'allow'", at_key=True)
    elif kind in ("contains", "not_contains"):
        yield from _one_of(check, path, "value", "values", f"a {kind} check")
    elif kind == "regex":
        yield from _regex(check.get("pattern"), (*path, "pattern"))
    elif kind == "excludes_pattern":
        yield from _one_of(check, path, "pattern", "patterns", "an excludes_pattern check")
        yield from _regex(check.get("pattern"), (*path, "pattern"))
        for index, pattern in enumerate(_list(check.get("patterns"))):
            yield from _regex(pattern, (*path, "patterns", index))
    elif kind in ("excludes_pii", "pii"):
        nothing_else = not check.get("deny_patterns") and not check.get("custom_patterns")
        if check.get("patterns") == [] and nothing_else:
            # Nothing left to look for: the check would pass on any output.
            yield Problem(
                (*path, "patterns"),
                "an empty list checks for nothing: name built-in patterns, or give "
                "'deny_patterns' or 'custom_patterns'",
            )
        for index, pattern in enumerate(_list(check.get("deny_patterns"))):
            yield from _regex(pattern, (*path, "deny_patterns", index))
        for index, custom in enumerate(_list(check.get("custom_patterns"))):
            yield from _regex(
                _dict(custom).get("pattern"), (*path, "custom_patterns", index, "pattern")
            )
    elif kind in ("llm_as_judge", "judge"):
        yield from _input_from(check.get("input_from"), (*path, "input_from"), services)


def _inline_schema(schema: Any, path: tuple[Any, ...]) -> Iterator[Problem]:
    if not isinstance(schema, dict):
        return
    validator_class = jsonschema.Draft202012Validator
    try:
        # With the metaschema's formats (a `$ref` that is no URI reference), as a plain
        # check_schema checks them, and as the schema check will (checks/families/_common.py).
        validator_class.check_schema(schema, format_checker=format_checker(validator_class))
    except jsonschema.SchemaError as exc:
        yield Problem(path, f"invalid JSON Schema: {exc.message}")
    except Exception as exc:  # a malformed schema can trip jsonschema itself
        yield Problem(path, f"invalid JSON Schema: {type(exc).__name__}: {exc}")


_INPUT_SOURCES = ("agent_output", "stdout", "workspace")


def _input_from(
    value: Any, path: tuple[Any, ...], services: dict[str, dict[str, Any]]
) -> Iterator[Problem]:
    if not isinstance(value, str) or value in _INPUT_SOURCES:
        return
    if value.startswith("workspace:"):
        if not value.removeprefix("workspace:").strip():
            yield Problem(path, "input_from 'workspace:' needs a path, e.g. 'workspace:report.md'")
        return
    service, dot, field_name = value.partition(".")
    if not dot or not service or not field_name:
        yield Problem(
            path,
            f"input_from '{value}' must be agent_output, stdout, workspace, workspace:PATH"
            " or SERVICE.FIELD",
        )
        return
    if service not in services:
        hint = suggestion(service, services) or _declared(services)
        yield Problem(path, f"unknown service '{service}' in input_from '{value}'{hint}")


def _chaos_rules(data: dict[str, Any]) -> Iterator[Problem]:
    tool_names = _declared_tool_names(data)
    seen: dict[str, int] = {}
    first_tool_fault: tuple[Any, ...] | None = None
    for index, scenario in enumerate(_list(data.get("chaos_matrix"))):
        if not isinstance(scenario, dict):
            continue
        path: tuple[Any, ...] = ("chaos_matrix", index)
        name = scenario.get("name")
        if isinstance(name, str):
            if name in seen:
                yield Problem(
                    (*path, "name"),
                    f"duplicate scenario name '{name}' (also chaos_matrix[{seen[name]}])",
                )
            else:
                seen[name] = index
        faults = _list(scenario.get("tool_faults"))
        if first_tool_fault is None:
            if faults:
                first_tool_fault = (*path, "tool_faults")
            elif _profile_has_tool_faults(scenario.get("profile")):
                first_tool_fault = (*path, "profile")
        for fault_index, fault in enumerate(faults):
            yield from _tool_ref(
                _dict(fault).get("tool"), (*path, "tool_faults", fault_index, "tool"), tool_names
            )
        for attack_index, attack in enumerate(_list(scenario.get("context_attacks"))):
            yield from _tool_ref(
                _dict(attack).get("tool"),
                (*path, "context_attacks", attack_index, "tool"),
                tool_names,
            )
    agent = _dict(data.get("agent"))
    if (
        first_tool_fault is not None
        and agent.get("type") == "python"
        and not (agent.get("tools") or agent.get("tool_registry"))
    ):
        # Flakestorm V2: tool faults on a python agent need callables to wrap; never skip them silently.
        yield Problem(
            ("agent",),
            "tool faults are configured (see "
            + format_path(first_tool_fault)
            + ") but the python agent lists no 'tools' or 'tool_registry' to inject them into",
            at_key=True,
        )


_GATEWAY_HINT = (
    "add `llm` (the agent's model endpoint, which the agent then reaches through the gateway"
    " at `$OPENAI_BASE_URL`)"
)


def _fault_reach_rules(data: dict[str, Any]) -> Iterator[Problem]:
    """Faults are injected where the agent talks to its model (the gateway, which runs only
    with `llm`) and its tools (the tool proxy, which runs only with tools to serve). A fault
    with neither never fires: its scenario counts as chaos in the resilience score and the
    chaos pillar while it runs exactly as with no chaos. Refused at the fault, saying what to
    add. (A python agent's tool faults without callables are `_chaos_rules`' refusal.)"""
    agent = _dict(data.get("agent"))
    agent_type = agent.get("type")
    if agent_type not in ("command", "http", "python"):
        return  # the schema reports the agent
    gateway = bool(data.get("llm"))
    python_tools = agent_type == "python" and bool(agent.get("tools") or agent.get("tool_registry"))
    # A replayed session's proxy runs only in the replay executions, which have no chaos.
    proxy = bool(data.get("tools")) or python_tools
    sandbox = _dict(data.get("sandbox"))
    network, backend = sandbox.get("network"), sandbox.get("backend")
    # bwrap and docker give `network: none` a network of its own with nothing in it: the
    # agent reaches neither the gateway nor the tool proxy (an http agent runs outside).
    cut_off = agent_type != "http" and network == "none" and backend in ("bwrap", "docker")
    for index, scenario in enumerate(_list(data.get("chaos_matrix"))):
        if not isinstance(scenario, dict):
            continue
        path: tuple[Any, ...] = ("chaos_matrix", index)
        if cut_off:
            keys = ("profile", "tool_faults", "llm_faults", "context_attacks")
            key = next((k for k in keys if scenario.get(k)), None)
            if key is not None:
                yield Problem(
                    (*path, key),
                    f"under `network: none` the {backend} sandbox lets the agent reach neither"
                    " the gateway nor the tool proxy, where faults are injected, so this"
                    " scenario's faults never fire (it counts as chaos but runs as with none);"
                    " set `sandbox.network: services` (the default)",
                    at_key=True,
                )
            continue
        if _list(scenario.get("tool_faults")) and not proxy and agent_type != "python":
            yield Problem(
                (*path, "tool_faults"),
                "nothing goes through the tool proxy, so these tool faults never fire (the"
                " scenario counts as chaos but runs as with none): " + _no_proxy(agent_type),
                at_key=True,
            )
        if _list(scenario.get("llm_faults")) and not gateway:
            yield Problem(
                (*path, "llm_faults"),
                "nothing goes through the gateway, so these LLM faults never fire (the scenario"
                " counts as chaos but runs as with none): Keystone injects them in the gateway,"
                " which runs only with `llm`; " + _GATEWAY_HINT,
                at_key=True,
            )
        for attack_index, attack in enumerate(_list(scenario.get("context_attacks"))):
            kind = _dict(attack).get("type")
            if not isinstance(kind, str):
                continue  # not a name (a list, say): the schema's error says so
            where = (*path, "context_attacks", attack_index, "type")
            if kind in TOOL_ANSWER_ATTACKS and not proxy:
                yield Problem(
                    where,
                    f"nothing goes through the tool proxy, so this {kind} attack"
                    " never fires: Keystone writes it into the tool answers the proxy relays; "
                    + _no_proxy(agent_type),
                )
            elif kind in CONVERSATION_ATTACKS and not gateway:
                yield Problem(
                    where,
                    f"nothing goes through the gateway, so this {kind} attack never fires:"
                    " Keystone rewrites the conversation the gateway forwards to the model,"
                    " and it runs only with `llm`; " + _GATEWAY_HINT,
                )
        yield from _profile_reach(
            scenario.get("profile"), (*path, "profile"), agent_type, gateway=gateway, proxy=proxy
        )


def _profile_reach(
    name: Any, path: tuple[Any, ...], agent_type: str, *, gateway: bool, proxy: bool
) -> Iterator[Problem]:
    """A built-in profile none of whose faults can fire (one whose faults partly fire still
    puts the agent under chaos, and its faults cannot be removed one by one: accepted)."""
    profile = _profile(name)
    if profile is None:
        return
    attacks = [_dict(a).get("type") for a in _list(profile.get("context_attacks"))]
    tool_side = bool(profile.get("tool_faults")) or any(a in TOOL_ANSWER_ATTACKS for a in attacks)
    llm_side = bool(profile.get("llm_faults")) or any(a in CONVERSATION_ATTACKS for a in attacks)
    if (tool_side and proxy) or (llm_side and gateway):
        return
    if tool_side and agent_type == "python" and profile.get("tool_faults"):
        return  # _chaos_rules refuses it at the agent, naming the profile
    needs = []
    if tool_side:
        needs.append("its faults on tools need the tool proxy: " + _no_proxy(agent_type))
    if llm_side:
        needs.append("its faults on the model need the gateway: " + _GATEWAY_HINT)
    yield Problem(
        path,
        f"none of the faults of profile '{name}' can fire, so this scenario counts as chaos but"
        " runs as with none: " + "; ".join(needs),
    )


def _no_proxy(agent_type: str) -> str:
    if agent_type == "python":
        return (
            "a `python` agent's tool calls go through it for the callables in its `tools` or"
            " `tool_registry`; list them there, or add the tools it calls to a top-level"
            " `tools` (the agent reaches each at `$KEYSTONE_TOOL_<NAME>_URL`)"
        )
    return (
        f"{_article(agent_type)} `{agent_type}` agent reaches a tool through it only when"
        " the tool is declared; add the tools it calls to `tools` (the agent reaches each at"
        " `$KEYSTONE_TOOL_<NAME>_URL`)"
    )


def _profile(name: Any) -> dict[str, Any] | None:
    if not isinstance(name, str):
        return None
    try:
        from checks.profiles import PROFILE_NAMES, load_profile
    except ImportError:  # profiles are optional for validation
        return None
    if name not in PROFILE_NAMES:
        return None  # the schema reports the unknown name
    try:
        return load_profile(name)
    except Exception:  # a broken profile file is the chaos runner's error to report, not the spec's
        return None


def _profile_has_tool_faults(name: Any) -> bool:
    return bool((_profile(name) or {}).get("tool_faults"))


def _declared_tool_names(data: dict[str, Any]) -> set[str] | None:
    """The tool names a fault may use; None when any name may be right: the entries of a
    python agent's `tool_registry` are named only inside the agent's process."""
    agent = _dict(data.get("agent"))
    if agent.get("type") == "python" and agent.get("tool_registry"):
        return None
    names = {
        str(t["name"])
        for t in _list(data.get("tools"))
        if isinstance(t, dict) and isinstance(t.get("name"), str)
    }
    if agent.get("type") == "python":
        # A python agent's tools are dotted callables; faults name them by function name.
        for dotted in _list(agent.get("tools")):
            if isinstance(dotted, str):
                names.add(dotted)
                names.add(re.split(r"[:.]", dotted)[-1])
    return names


def _tool_ref(tool: Any, path: tuple[Any, ...], tool_names: set[str] | None) -> Iterator[Problem]:
    if tool_names is None or not isinstance(tool, str) or tool == "*" or tool in tool_names:
        return
    hint = suggestion(tool, tool_names) or (
        f" (declared: {', '.join(sorted(tool_names))})"
        if tool_names
        else " (no tools are declared under 'tools')"
    )
    yield Problem(path, f"unknown tool '{tool}'{hint}")


def _scoring_rules(data: dict[str, Any]) -> Iterator[Problem]:
    weights = _dict(_dict(data.get("scoring")).get("weights"))
    values = list(weights.values())
    if not values or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    ):
        return
    total = math.fsum(values)
    if math.isfinite(total) and abs(total - 1.0) > WEIGHT_TOLERANCE:
        yield Problem(("scoring", "weights"), f"weights must sum to 1.0, got {round(total, 6)}")


def _gate_rules(data: dict[str, Any]) -> Iterator[Problem]:
    gates = _dict(data.get("gates"))
    if "cost_max_usd" in gates and not data.get("llm"):
        yield Problem(
            ("gates", "cost_max_usd"),
            "nothing records this agent's cost, so cost_max_usd sees $0 on every run:"
            " Keystone prices only the LLM calls that pass through the gateway, and without"
            " `llm` there are none, whatever the agent spends; add `llm` (the gateway records"
            " each call's tokens and cost)",
        )


def _provider_rules(data: dict[str, Any]) -> Iterator[Problem]:
    for index, rule in enumerate(_list(_dict(data.get("llm")).get("rules"))):
        when = _dict(_dict(rule).get("when"))
        yield from _regex(
            when.get("last_user_matches"), ("llm", "rules", index, "when", "last_user_matches")
        )
    for index, rule in enumerate(_list(_dict(data.get("judge")).get("rules"))):
        when = _dict(_dict(rule).get("when"))
        for key in ("output_matches", "criteria_matches"):
            yield from _regex(when.get(key), ("judge", "rules", index, "when", key))


def _forbidden_rules(
    data: dict[str, Any], services: dict[str, dict[str, Any]]
) -> Iterator[Problem]:
    forbidden = _dict(data.get("forbidden"))
    for index, name in enumerate(_list(forbidden.get("http_except"))):
        if isinstance(name, str) and name not in services:
            hint = suggestion(name, services) or _declared(services)
            yield Problem(("forbidden", "http_except", index), f"unknown service '{name}'{hint}")
    yield from _forbidden_reach_rules(data, forbidden, services)


def _refusal_recorder(data: dict[str, Any]) -> str | None:
    """Why no refused connection is ever recorded (evaluations.runner.sandbox: only the bwrap
    and docker backends, under `network: services`, record the connections they refuse), or
    None when some may be."""
    if _dict(data.get("agent")).get("type") == "http":
        return "an `http` agent runs outside any sandbox"
    sandbox = _dict(data.get("sandbox"))
    network = sandbox.get("network", "services")
    if network != "services":
        return f"under `network: {network}` it records none"
    if sandbox.get("backend") == "local":
        return "the `local` backend records none"
    return None


def _forbidden_reach_rules(
    data: dict[str, Any], forbidden: dict[str, Any], services: dict[str, dict[str, Any]]
) -> Iterator[Problem]:
    """A forbidden rule that nothing recorded can ever violate passes on every execution
    (checks.forbidden reads what the harness recorded): refused, saying what to add."""
    databases = [n for n, s in services.items() if s.get("type") in DATABASE_KINDS]
    if isinstance(forbidden.get("db_writes_outside"), list) and not databases:
        yield Problem(
            ("forbidden", "db_writes_outside"),
            "nothing records this agent's database writes, so db_writes_outside sees none on"
            " any execution: Keystone compares the tables of each database service with its"
            " seed, and no postgres, mysql or sqlite service is declared; add the database"
            " the agent writes to under `services`",
        )
    allowed = forbidden.get("http_except")
    if isinstance(allowed, list):
        mocks = [n for n, s in services.items() if s.get("type") == "http_mock"]
        refused_by = _refusal_recorder(data)
        if all(m in allowed for m in mocks) and refused_by is not None:
            what = (
                "every http_mock service is in the list"
                if mocks
                else "no http_mock service is declared"
            )
            yield Problem(
                ("forbidden", "http_except"),
                "nothing records a request this rule could refuse, so http_except passes on"
                " every execution: it sees the requests to http_mock services ("
                + what
                + ") and the connections the sandbox refuses ("
                + refused_by
                + "); declare under `services` an http_mock the agent must not call and leave"
                " it out of the list"
                + (
                    ""
                    if refused_by.startswith("an `http`")
                    else ", or run the agent under the bwrap or docker backend with"
                    " `network: services`"
                ),
            )
    if forbidden.get("secrets_in_logs") == "deny" and not _list(data.get("secrets")):
        yield Problem(
            ("forbidden", "secrets_in_logs"),
            "no secret is named, so secrets_in_logs: deny looks for nothing and passes on every"
            " execution: it looks for the values of the spec's `secrets` in the output, the"
            " logs, the LLM calls and the HTTP calls; add `secrets` (the server environment"
            " variables the agent gets)",
        )


def _file_rules(data: dict[str, Any], spec_dir: Path) -> Iterator[Problem]:
    """Files the spec names relative to itself must exist next to it."""
    references: list[tuple[Any, tuple[Any, ...]]] = []
    references.append((_dict(data.get("sandbox")).get("workspace"), ("sandbox", "workspace")))
    for index, service in enumerate(_list(data.get("services"))):
        references.append((_dict(service).get("seed"), ("services", index, "seed")))
    for invariant_id, invariant in _dict(data.get("invariants")).items():
        check = _dict(_dict(invariant).get("check"))
        # The files a check reads next to the spec: fail at validation, not at run time.
        named = {"schema": "schema_file", "custom": "script", "python_hook": "path"}
        field = named.get(str(check.get("type")))
        if field is not None:
            references.append((check.get(field), ("invariants", invariant_id, "check", field)))
    for index, session in enumerate(_list(_dict(data.get("replay")).get("sessions"))):
        references.append((_dict(session).get("file"), ("replay", "sessions", index, "file")))
    for value, path in references:
        if isinstance(value, str) and value and not _exists(spec_dir, value):
            yield Problem(path, f"file not found: '{value}' (relative to {spec_dir})")


def _exists(spec_dir: Path, relative: str) -> bool:
    try:
        return (spec_dir / relative).exists()
    except (OSError, ValueError):  # e.g. an embedded NUL or a name too long
        return False
