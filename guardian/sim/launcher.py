"""A launcher for simulated engines: guardian's restarts reach the simulator at the launcher seam.

It maps the vLLM arguments a restart asks for onto the simulated engine's
parameters, so a restart with a lower ``--gpu-memory-utilization`` really
leaves more of the simulated GPU free, ``--kv-cache-dtype fp8`` really
doubles the KV blocks, and ``--max-num-seqs`` really caps the batch:

- blocks scale with the memory left after the weights:
  ``blocks x (util - weights) / (util0 - weights)``, weights = 20% of the GPU;
- fp8 KV-cache types hold twice the blocks in the same memory;
- ``--speculative-config`` sets the draft tokens (absent: speculation off).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from guardian.actions.engine_args import EngineArgs
from guardian.actions.launcher import ProcessStatus
from guardian.actions.outcome import Outcome
from guardian.sim.engine import EngineModel, EngineParams
from guardian.sim.server import SimServer

WEIGHTS_SHARE = 0.2  # of the GPU: an 8B model in bf16 on an 80 GB card


def engine_params(base: EngineParams, args: EngineArgs) -> EngineParams:
    """The simulated engine vLLM would start with these arguments."""
    util = float(args.get("gpu-memory-utilization", base.gpu_memory_utilization))  # type: ignore[arg-type]
    scale = max(0.0, util - WEIGHTS_SHARE) / (base.gpu_memory_utilization - WEIGHTS_SHARE)
    if str(args.get("kv-cache-dtype", "auto")).startswith("fp8"):
        scale *= 2
    block = int(args.get("block-size", base.block_size))  # type: ignore[arg-type]
    blocks = int(base.num_gpu_blocks * scale * base.block_size / block)
    spec: Any = args.get("speculative-config")
    if isinstance(spec, str):
        spec = json.loads(spec)
    return dataclasses.replace(
        base,
        gpu_memory_utilization=util,
        num_gpu_blocks=max(1, blocks),
        block_size=block,
        max_num_seqs=int(args.get("max-num-seqs", base.max_num_seqs)),  # type: ignore[arg-type]
        long_prefill_token_threshold=int(args.get("long-prefill-token-threshold", base.long_prefill_token_threshold)),  # type: ignore[arg-type]
        spec_tokens=int(spec.get("num_speculative_tokens", 1)) if isinstance(spec, dict) else 0,
    )


class SimLauncher:
    def __init__(self, server: SimServer, load_seconds: float = 2.0, crash_on_start: bool = False, seed: int = 0) -> None:
        self.server = server
        self.base = server.engine.params
        self.load_seconds = load_seconds
        self.crash_on_start = crash_on_start
        self.seed = seed
        self.describe = f"simulated engine at {server.url}"
        self.started_with: list[EngineArgs] = []
        self._task: asyncio.Task[None] | None = None

    async def restart(self, args: EngineArgs) -> Outcome:
        params = engine_params(self.base, args)
        self.started_with.append(dict(args))
        engine = EngineModel(params, seed=self.seed + self.server.restarts + 1)
        self._task = asyncio.create_task(self.server.restart(engine, self.load_seconds, self.crash_on_start))
        await asyncio.sleep(0)  # the old engine is gone once this returns, as after systemctl restart
        return Outcome("restart", "done", f"simulated engine restarting ({self.load_seconds:g}s to load)")

    async def alive(self) -> bool | None:
        return not self.server.exited

    def status(self) -> ProcessStatus:
        return ProcessStatus(not self.server.exited, self.server.process_started)
