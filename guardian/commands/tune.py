"""``guardian tune``: the offline search over engine arguments, against a configured engine or the simulator."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from guardian import config as cfg
from guardian import logs
from guardian.actions.gateway import NoGateway
from guardian.actions.restart import DrainedRestart
from guardian.actions.vllm_admin import VllmAdmin
from guardian.commands import tune_search as tune
from guardian.commands.common import DEFAULT_CONFIG, load_or_exit
from guardian.commands.plotting import PlotUnavailable
from guardian.daemon import launcher_for
from guardian.sim.engine import EngineModel
from guardian.sim.launcher import SimLauncher
from guardian.sim.server import SimServer
from guardian.sources.vllm import VllmScraper

# The search judges every point against one objective fixed before it measures anything, so without --slo-ms or
# [tuner.slo] target_seconds it needs a number of its own; the live tuner derives its objective from the engine instead.
OFFLINE_SLO_SECONDS = 0.2


def main(args: argparse.Namespace) -> int:
    if args.config is None and args.engine != "sim":
        args.config = DEFAULT_CONFIG
    config = load_or_exit(args.config) if args.config is not None else cfg.Config()
    logs.configure("console", "warning")
    t = config.tune
    speculative = dict(config.tuner.speculative_config) if config.tuner.speculative_config else None
    configured = config.tuner.slo.target_seconds
    slo = args.slo_ms / 1000 if args.slo_ms else (configured or OFFLINE_SLO_SECONDS)
    section = next((e for e in config.engines if e.name == args.engine), None)
    if section is None and args.engine != "sim":
        print(f"guardian tune: no engine {args.engine!r} in {args.config}", file=sys.stderr)
        return 2
    if section is not None and section.restart is None:
        print(f"guardian tune: engine {args.engine!r} has no [engines.restart]: guardian cannot restart it per point", file=sys.stderr)
        return 2
    if (args.seconds is not None and args.seconds <= 0) or (args.rates and min(args.rates) <= 0) or (args.slo_ms is not None and args.slo_ms <= 0):
        print("guardian tune: --seconds, --rates and --slo-ms must be above 0", file=sys.stderr)
        return 2
    backend = section.restart.attention_backend if section and section.restart else "flash_attn"
    try:
        points = tune.grid(args.block_sizes or t.block_sizes, args.max_num_seqs or t.max_num_seqs,
                           [s == "on" for s in args.speculation] if args.speculation else t.speculation, backend, speculative)  # fmt: skip
    except tune.TuneError as exc:
        print(f"guardian tune: {exc}", file=sys.stderr)
        return 2
    reqs = tune.requests(t.requests, t.seed, t.prompt_tokens_median, t.prompt_tokens_sigma, t.prompt_tokens_max,
                         t.output_tokens_median, t.output_tokens_sigma, t.output_tokens_max)  # fmt: skip
    # without a config (the simulator) the state directory may not be ours: the results go next to the caller
    results = args.results or (config.guardian.state_dir if args.config else Path.cwd()) / f"tune-{args.engine}.jsonl"
    try:
        found = asyncio.run(tune_engine(config, section, points, reqs, args.rates or t.rates, args.seconds or t.seconds_per_rate,
                                         slo, t.seed, speculative, results))  # fmt: skip
    except (tune.TuneError, OSError) as exc:
        print(f"guardian tune: {exc}", file=sys.stderr)
        return 2
    chosen = tune.best(found, slo)
    print()
    print(tune.table(found, slo, chosen))
    print()
    if chosen is None:
        print(f"no point met the SLO (P99 TTFT <= {slo * 1000:g} ms with nothing failed): try lower rates or a larger GPU")
    else:
        point = next(p for p in points if p.key == chosen.point)
        print(f"best: {point}: {chosen.requests_per_second:.2f} req/s finished ({chosen.rate:g} req/s offered), "
              f"P99 TTFT {chosen.p99_ttft_seconds * 1000:.0f} ms (SLO {slo * 1000:g} ms), "  # type: ignore[operator]
              f"{chosen.tokens_per_second:.0f} tok/s")  # fmt: skip
        print(f"  engine arguments: --block-size {point.block_size} --max-num-seqs {point.max_num_seqs}"
              + (" --speculative-config '" + json.dumps(speculative, separators=(",", ":")) + "'" if point.speculation else ""))
    print(f"results: {results}")
    if args.plot:
        try:
            tune.plot(found, slo, args.plot)
        except PlotUnavailable as exc:
            print(f"guardian tune: {exc}", file=sys.stderr)
            return 2
        print(f"plot: {args.plot}")
    return 0 if chosen is not None else 1


async def tune_engine(config: cfg.Config, section: cfg.EngineSection | None, points: list, reqs: list, rates: list[float],  # type: ignore[type-arg]
                       seconds: float, slo: float, seed: int, speculative: dict | None, results: Path) -> list:  # type: ignore[type-arg]  # fmt: skip
    """The search against a configured engine (its launcher), or against a simulated one started here."""


    server = None
    if section is None:  # --engine sim
        server = SimServer(EngineModel(seed=seed), dev_mode=True)
        await server.start()
        url, api_key, base, dev, backend = server.url, None, {}, True, "flash_attn"
        launcher: Any = SimLauncher(server, load_seconds=1.0, seed=seed)
    else:
        assert section.restart is not None
        url, api_key, dev, backend = section.url, section.read_api_key(), section.dev_mode, section.restart.attention_backend
        base = config.base_args(section)
        launcher = launcher_for(section, config.guardian.state_dir)
    scraper = VllmScraper(section.name if section else "sim", url, 10.0, api_key)
    try:
        async with aiohttp.ClientSession() as session:
            procedure = DrainedRestart(section.name if section else "sim", launcher, NoGateway(),
                                       VllmAdmin(url, session) if dev else None, scraper.health, scraper.load,
                                       config.actions.timeouts, backend)  # fmt: skip
            search = tune.Search(url, api_key, base, points, sorted(rates), seconds, reqs, slo, seed, speculative, results)
            found = await tune.run(search, procedure.run)
            if section is not None:
                print("restarting the engine with its own arguments again", flush=True)
                outcome = await procedure.run(base)
                if not outcome.ok:
                    print(f"guardian tune: the engine did not come back with its own arguments: {outcome.detail}", file=sys.stderr)
            return found
    finally:
        scraper.close()
        if server is not None:
            await server.stop()
