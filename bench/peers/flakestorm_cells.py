"""Flakestorm's per-cell verdicts for run_peers.py, run with Flakestorm's own Python.

    .venv-flakestorm/bin/python bench/peers/flakestorm_cells.py CONFIG OUT.json

`flakestorm contract run` prints only the score and pass/fail, and Flakestorm 2.0 has no
option to write its matrix. This makes the calls `contract run` makes (load the config,
build and instrument the agent adapter, run the contract engine) and writes the matrix
with Flakestorm's own JSON export, so the verdicts compared are Flakestorm's. It is not
timed: run_peers.py times the `flakestorm contract run` command itself.
"""

from __future__ import annotations

import asyncio
import sys

from flakestorm.contracts.engine import ContractEngine
from flakestorm.core.config import load_config
from flakestorm.core.protocol import create_agent_adapter, create_instrumented_adapter
from flakestorm.reports.contract_json import export_contract_json


async def main(config_path: str, out: str) -> None:
    config = load_config(config_path)
    if config.contract is None:
        raise SystemExit(f"{config_path}: no contract")
    agent = create_agent_adapter(config.agent)
    if config.chaos:
        agent = create_instrumented_adapter(agent, config.chaos)
    matrix = await ContractEngine(config, config.contract, agent).run()
    export_contract_json(matrix, out)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
