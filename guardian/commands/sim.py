"""``guardian sim``: simulated vLLM servers, alone, for trying guardian (or a dashboard) against them."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys

from guardian.actions.engine_args import from_argv, validate
from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster
from guardian.sim.launcher import engine_params


def main(args: argparse.Namespace) -> int:
    scenario = scenarios.get(args.scenario)
    argv = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    if argv:
        try:
            engine_args = from_argv(argv)
        except ValueError as exc:
            print(f"guardian sim: {exc}", file=sys.stderr)
            return 2
        problems = validate(engine_args)
        if problems:  # what vLLM itself would refuse to start with
            print("guardian sim: " + "; ".join(problems), file=sys.stderr)
            return 2
        scenario = dataclasses.replace(scenario, engine=engine_params(scenario.engine, engine_args))

    async def serve() -> None:
        core = None
        if argv:  # a stand-in for `vllm serve`: its engine core is a process of the same group, left behind by kill -9
            core = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)", "guardian-sim-engine-core"])
        await asyncio.sleep(args.load_seconds)  # loading: nothing listens yet
        cluster = SimCluster(scenario, engines=args.engines, seed=args.seed)
        ports = [args.port + i for i in range(args.engines)] if args.port else None
        await cluster.start(ports=ports)
        for i, url in enumerate(cluster.urls):
            print(f"simulated vLLM server {i}: {url}", flush=True)
        if args.ports_file:
            args.ports_file.write_text("".join(url + "\n" for url in cluster.urls))
        try:
            if args.no_load:
                await asyncio.Event().wait()
            else:
                await cluster.run_load(None)
        finally:
            await cluster.stop()
            if core is not None:
                core.terminate()

    asyncio.run(serve())
    return 0
