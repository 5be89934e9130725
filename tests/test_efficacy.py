"""Protection against a simulated host that fails (bench/efficacy.py's harness, shortened): guardian must prevent the harm."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def efficacy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("efficacy", ROOT / "bench" / "efficacy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["efficacy"] = module
    spec.loader.exec_module(module)
    return module


def test_a_leak_that_kills_vllm_unguarded_is_restarted_in_time_at_the_same_utilisation_losing_no_request(efficacy: ModuleType) -> None:
    unguarded = efficacy.run_one(("leak-to-oom", "unguarded", False, 1, 22.0, False))
    guarded = efficacy.run_one(("leak-to-oom", "guarded", False, 1, 22.0, False))
    assert unguarded.exits["oom"] == 1 and unguarded.outcomes["failed"] > 100  # the harm is real
    assert guarded.exits["oom"] == 0 and guarded.cut_by_restart == 0
    assert dict(guarded.restarts) == {"free_reserve": 1} and guarded.pages == 0 and guarded.warnings >= 1
    lost = guarded.outcomes["failed"] + guarded.outcomes["cut"] + guarded.outcomes["refused_429"] + guarded.outcomes["refused_503"]
    assert lost < unguarded.outcomes["failed"] / 2


def test_another_process_growing_on_the_gpu_pages_naming_it_and_vllm_is_not_restarted_in_a_loop(efficacy: ModuleType) -> None:
    unguarded = efficacy.run_one(("foreign-leak", "unguarded", False, 1, 20.0, False))
    guarded = efficacy.run_one(("foreign-leak", "guarded", False, 1, 20.0, False))
    assert unguarded.exits["refused_to_start"] > 5  # systemd's crash loop: vLLM cannot start beside the other process
    assert guarded.exits["oom"] == 0 and guarded.exits["refused_to_start"] == 0 and sum(guarded.restarts.values()) == 1
    (page,) = guarded.page_texts
    assert "other processes hold 4.0% of the GPU (pid 4242" in page and "--gpu-memory-utilization 0.87" in page


def test_an_engine_started_too_small_is_restarted_once_by_the_tuner_and_then_serves_within_the_slo(efficacy: ModuleType) -> None:
    untuned = efficacy.run_one(("too-small", "guarded", False, 1, 12.0, False))  # [tuner] enabled = false
    tuned = efficacy.run_one(("too-small", "guarded", False, 1, 12.0, True))  # guardian's defaults: the tuner on
    assert untuned.late_good / untuned.late_sent < 0.1  # --max-num-seqs 4 cannot serve 5 req/s: the harm is real
    assert dict(tuned.restarts) == {"tune_max_num_seqs": 1} and tuned.cut_by_restart == 0
    assert tuned.late_good / tuned.late_sent >= 0.9  # what is sent after the first ten minutes gets its first token in time


def test_in_a_flood_of_long_prompts_short_ones_get_their_first_token_about_as_fast_as_without_the_flood(efficacy: ModuleType) -> None:
    from efficacy_scoring import quantile  # bench/, on the path once efficacy.py is loaded

    unguarded = efficacy.run_one(("flood", "unguarded", False, 1, 16.0, True))
    flood = efficacy.run_one(("flood", "guarded", False, 1, 16.0, True))
    calm = efficacy.run_one(("flood", "guarded", True, 1, 16.0, True))  # the same short requests, no long ones
    assert unguarded.good / unguarded.sent < 0.05  # the harm is real: the engine drowns in prefill
    short_p99 = quantile(flood.short_ttft, 0.99)
    assert short_p99 <= 2 * quantile(calm.short_ttft, 0.99)  # long prompts keep to 0.5% of the engine's time
    assert flood.good / flood.sent > 0.6 and flood.outcomes["refused_429"] > 0.2 * flood.sent  # what is given up: most long ones
    assert dict(flood.restarts) == {}  # nor a restart for vLLM's long-prefill cap: the flood never holds others back
