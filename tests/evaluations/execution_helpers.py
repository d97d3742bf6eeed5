"""Running a spec to completion in the test process, as `keystone run` does without a broker.

The rows are written through the services; tests that execute need committed rows
(transaction=True or committed fixtures), because the runner's lease watcher uses a
connection of its own.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from evaluations import services
from evaluations.models import Project, Run, Trigger

WORKER = "tests:in-process"


def execute_run(run: Run) -> Run:
    """Plan the run, execute each pending execution here, finalize it and return it fresh."""
    for execution_id in services.run_plan(run_id=run.pk):
        # Nothing else works on these rows: an execution not claimed here would leave the run
        # unfinished, so say so where it happens.
        assert services.execution_execute(execution_id=execution_id, worker=WORKER), execution_id
    services.run_finalize_if_done(run_id=run.pk)
    run.refresh_from_db()
    return run


def new_run(project: Project, source: str, **options: Any) -> Run:
    """A new spec version of `source` in `project` and a queued CLI run of it (`options` go
    to run_create: spec_dir, seed, replicas, scenarios, labels, judge_cache, ...)."""
    version = services.spec_version_create(project=project, source_yaml=source)
    return services.run_create(spec_version=version, trigger=Trigger.CLI, enqueue=False, **options)


def planned_run(project: Project, source: str, **options: Any) -> tuple[Run, list[int]]:
    """new_run, planned: the run and the ids of its executions."""
    run = new_run(project, source, **options)
    return run, services.run_plan(run_id=run.pk)


def run_spec(project: Project, source: str, *, spec_dir: Path | str, **options: Any) -> Run:
    """new_run of `source` in `project`, run to completion."""
    return execute_run(new_run(project, source, spec_dir=str(spec_dir), **options))


def agent_asking_the_model(on_error: str) -> str:
    """A python script that asks the model once through the gateway ($OPENAI_BASE_URL) and
    prints its answer, or `on_error` when the gateway answers with an error (a fault)."""
    return f"""
import json, os, urllib.error, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
    headers={{"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}},
)
try:
    print(json.load(urllib.request.urlopen(request, timeout=20))["choices"][0]["message"]["content"])
except urllib.error.HTTPError:
    print({on_error!r})
"""


def script_agent(script: str) -> str:
    """A spec's `agent` and `sandbox`: a command agent running `script` as its agent.py on the
    local backend."""
    return f"""\
agent: {{type: command, command: "python agent.py", timeout: 60}}
sandbox:
  backend: local
  files:
    agent.py: |
{textwrap.indent(script.strip(), " " * 6)}
"""
