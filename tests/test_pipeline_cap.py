"""The gateway's cap when the tuner is on: the KV pool's measure under the tuner's batch (pipeline.py), poll by poll."""

from __future__ import annotations

from guardian import config as cfg
from guardian.pipeline import Pipeline
from guardian.policy.response import Action
from guardian.sample import CoreReading, EngineReading, GatewayLoad, Histogram, NvmlReading, Sample


def _ttft(t: float) -> dict[str, Histogram]:
    """Five requests a second, every first token within 100 ms: the engine is fast."""
    n = 5.0 * t
    return {"vllm:time_to_first_token_seconds": Histogram(((0.1, n), (1.0, n), (float("inf"), n)), n, 0.05 * n)}


def _config(max_num_seqs: int | None = None) -> cfg.Config:
    restart = cfg.RestartSection(launcher="systemd", unit="vllm.service", env_file="/etc/vllm/args.env", args={"max-num-seqs": max_num_seqs}) if max_num_seqs else None
    return cfg.Config(gateway=cfg.GatewaySection(concurrency=64), engines=[cfg.EngineSection(name="e", url="http://127.0.0.1:8000", restart=restart)])


def _poll(p: Pipeline, t: float, running: int, waiting: int, kv: float, in_flight: int, queued: int, cap: int) -> list[Action]:
    core = CoreReading("0", running=running, waiting=waiting, kv_cache_usage=kv, preemptions_total=0.0, histograms=_ttft(t))
    sample = Sample(t, 1.7e9 + t, NvmlReading(), (EngineReading("e", up=True, healthy=True, cores=(core,)),),
                    (GatewayLoad("e", queued=queued, in_flight=in_flight, cap=cap),))  # fmt: skip
    return [a for a in p.step(sample).decision.actions if a.kind == "tune"]


def _applied(actions: list[Action], cap: int) -> int:
    """The gateway's cap after the executor applied this poll's actions, in order."""
    for a in actions:
        cap = int(a.details.get("cap", a.details["batch"]))
    return cap


def test_with_the_tuner_on_a_full_pool_still_brings_the_gateways_cap_down_to_what_the_engine_runs() -> None:
    p = Pipeline(_config(), None)
    assert p.config.tuned("e")
    cap = _applied(_poll(p, 0.0, running=40, waiting=0, kv=0.5, in_flight=40, queued=0, cap=64), 64)
    assert cap == 64
    cap = _applied(_poll(p, 1.0, running=30, waiting=10, kv=0.95, in_flight=40, queued=5, cap=cap), cap)
    assert cap == 30  # the pool's measure, under the tuner's batch of 64
    assert p.tuners["e"].batch == 64


def test_the_cap_never_grows_past_the_tuners_batch() -> None:
    p = Pipeline(_config(max_num_seqs=8), None)
    cap = _applied(_poll(p, 0.0, running=0, waiting=0, kv=0.0, in_flight=0, queued=0, cap=64), 64)
    assert cap == 8  # the tuner starts at the engine's --max-num-seqs, and the cap comes down to it at once
    for t in range(1, 60):  # held back at the cap with room: the pool's measure would grow, the batch bounds it
        cap = _applied(_poll(p, float(t), running=cap, waiting=0, kv=0.3, in_flight=cap, queued=3, cap=cap), cap)
    assert cap <= p.tuners["e"].batch
