"""``guardian probe``: one look at a vLLM server (and NVML where present), as guardian sees it.

The first thing an operator runs on a new host: does guardian reach the
server, does the page parse, which block size and pool does the engine
report, and what does NVML say. Quantiles here are over the server's whole
lifetime (one scrape has no window); the daemon's are over its window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import aiohttp
import pynvml

from guardian import config as cfg
from guardian.actions.vllm_admin import VllmAdmin
from guardian.analysis.latency import histogram_quantile
from guardian.sample import CoreReading, NvmlReading
from guardian.sources.nvml import NvmlSource
from guardian.sources.offloop import OffloopWorker, WorkerBusy
from guardian.sources.vllm import VllmScraper
from guardian.sources.vllm_page import LATENCY_HISTOGRAMS


async def probe(url: str, timeout: float, api_key: str | None, nvml_module: Any | None = pynvml) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        scraper = VllmScraper("probe", url, timeout, api_key)
        try:
            reading = await scraper.scrape()
        finally:
            scraper.close()
        dev = await VllmAdmin(url, session, timeout).is_paused() if reading.up or reading.healthy else None
    result: dict[str, Any] = {
        "url": url,
        "up": reading.up,
        "healthy": reading.healthy,
        "error": reading.error,
        # the operational endpoints guardian's breaker acts through (VLLM_SERVER_DEV_MODE=1)
        "dev_endpoints": None if dev is None else {"available": dev.ok, "detail": dev.detail},
        "cores": [_core(c) for c in reading.cores],
    }
    if nvml_module is not None:
        result["nvml"] = _nvml(await _read_nvml(nvml_module, timeout))
    return result


async def _read_nvml(nvml_module: Any, timeout: float) -> NvmlReading:
    source = NvmlSource("all", nvml_module)
    try:
        return await OffloopWorker("probe-nvml").call(source.read, timeout)
    except (asyncio.TimeoutError, WorkerBusy):
        return NvmlReading(error=f"NVML did not answer within {timeout:g}s")
    finally:
        source.close()


def _core(core: CoreReading) -> dict[str, Any]:
    latency: dict[str, dict[str, float | None] | None] = {}
    for short, family in LATENCY_HISTOGRAMS.items():
        hist = core.histograms.get(family)
        if hist is None:
            latency[short] = None
            continue
        latency[short] = {
            "p50_seconds": histogram_quantile(0.5, hist.buckets),
            "p90_seconds": histogram_quantile(0.9, hist.buckets),
            "p99_seconds": histogram_quantile(0.99, hist.buckets),
            "count": hist.count,
            "mean_seconds": hist.sum / hist.count if hist.count and hist.sum is not None else None,
        }
    return {
        "core": core.core,
        "model": core.model_name,
        "kv_cache_usage": core.kv_cache_usage,
        "running": core.running,
        "waiting": core.waiting,
        "block_size": core.block_size,
        "num_gpu_blocks": core.num_gpu_blocks,
        "gpu_memory_utilization": core.gpu_memory_utilization,
        "preemptions_total": core.preemptions_total,
        "generation_tokens_total": core.generation_tokens_total,
        "sleeping": core.sleeping,
        "latency_since_start": latency,
    }


def _nvml(reading: NvmlReading) -> dict[str, Any]:
    return {
        "available": reading.ok,
        "error": reading.error,
        "driver_version": reading.driver_version,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_free_bytes": g.memory_free_bytes,
                "utilization_ratio": g.utilization_gpu_ratio,
                "power_watts": g.power_watts,
                "temperature_celsius": g.temperature_celsius,
                "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in g.processes or ()],
                "mig_slices": len(g.mig),
                "error": g.error,
            }
            for g in reading.gpus
        ],
    }


def render_text(result: dict[str, Any]) -> str:
    lines = [f"vLLM server {result['url']}"]
    if not result["up"]:
        lines.append(f"  unreachable or unreadable: {result['error']}")
    elif result["error"]:
        lines.append(f"  warning: {result['error']}")
    health = {True: "200 OK", False: "failing", None: "no answer"}[result["healthy"]]
    lines.append(f"  /health: {health}")
    dev = result.get("dev_endpoints")
    if dev is not None:
        lines.append("  dev endpoints (/pause, /reset_prefix_cache): " + ("available" if dev["available"] else dev["detail"]))
    for core in result["cores"]:
        lines.append(f"  engine core {core['core'] or '-'} ({core['model'] or 'model unknown'})")
        lines.append(
            f"    KV cache usage {_pct(core['kv_cache_usage'])}, running {_num(core['running'])}, "
            f"waiting {_num(core['waiting'])}, preemptions {_num(core['preemptions_total'])}"
        )
        lines.append(
            f"    block size {_num(core['block_size'])}, GPU blocks {_num(core['num_gpu_blocks'])}, "
            f"gpu_memory_utilization {core['gpu_memory_utilization'] if core['gpu_memory_utilization'] is not None else '?'}"
        )
        for short, q in core["latency_since_start"].items():
            if q is None:
                continue
            lines.append(
                f"    {short:<5} p50 {_ms(q['p50_seconds'])}  p90 {_ms(q['p90_seconds'])}  "
                f"p99 {_ms(q['p99_seconds'])}  ({_num(q['count'])} observations since start)"
            )
    nvml = result.get("nvml")
    if nvml is not None:
        if not nvml["available"]:
            lines.append(f"NVML: not available ({nvml['error']})")
        else:
            lines.append(f"NVML: driver {nvml['driver_version']}, {len(nvml['gpus'])} GPU(s)")
        for g in nvml["gpus"]:
            if g["memory_total_bytes"] is None:
                lines.append(f"  GPU {g['index']}: {g['error']}")
                continue
            lines.append(
                f"  GPU {g['index']} {g['name']}: {_gib(g['memory_used_bytes'])} / {_gib(g['memory_total_bytes'])} used, "
                f"util {_pct(g['utilization_ratio'])}, {len(g['processes'])} compute process(es)"
                + (f"; {g['error']}" if g["error"] else "")
            )
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value * 1000:.0f} ms"


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def main(args: argparse.Namespace) -> int:
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and api_key is None:
        print(f"guardian probe: environment variable {args.api_key_env} is not set", file=sys.stderr)
        return 2
    try:
        cfg.EngineSection(name="probe", url=args.vllm)
    except Exception:
        print(f"guardian probe: {args.vllm!r} is not an http(s) base URL, e.g. http://127.0.0.1:8000", file=sys.stderr)
        return 2
    nvml_module = None
    if not args.no_nvml:
        import pynvml

        nvml_module = pynvml
    result = asyncio.run(probe(args.vllm, args.timeout, api_key, nvml_module))
    print(json.dumps(result, indent=2) if args.json else render_text(result))
    return 0 if result["up"] else 1
