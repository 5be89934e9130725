from __future__ import annotations

import math

from guardian.sources import promtext, vllm_page


def _cores(text: str):
    return vllm_page.cores_from_page(promtext.parse(text))


def test_real_vllm_page_gives_the_values_vllm_reported(vllm_page: str) -> None:
    (core,) = _cores(vllm_page)
    assert core.core == "0"
    assert core.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert core.kv_cache_usage == 0.4375
    assert (core.running, core.waiting) == (12, 4)
    assert core.preemptions_total == 1
    assert core.prompt_tokens_total == 5000
    assert core.prefill_seconds_total == 0.12  # vllm:request_prefill_time_seconds_sum: only the sum is kept
    assert core.finished_prompt_tokens_total == 900  # vllm:request_prompt_tokens_sum: the same requests' prompts
    assert core.generation_tokens_total == 40
    assert core.requests_finished_total == 1  # summed over finished_reason
    assert (core.block_size, core.num_gpu_blocks, core.gpu_memory_utilization) == (16, 27000, 0.9)
    assert core.cache_config["enable_prefix_caching"] == "True"
    assert (core.spec_draft_tokens_total, core.spec_accepted_tokens_total) == (6, 5)
    assert core.sleeping is False
    e2e = core.histograms["vllm:e2e_request_latency_seconds"]
    assert e2e.buckets[0] == (0.3, 0.0) and e2e.buckets[-1] == (math.inf, 1.0)
    assert (e2e.count, e2e.sum) == (1.0, 4.2)


def test_missing_families_stay_unknown_not_zero() -> None:
    (core,) = _cores('vllm:num_requests_running{engine="0",model_name="m"} 3\n')
    assert core.running == 3
    assert core.waiting is None
    assert core.kv_cache_usage is None
    assert core.block_size is None
    assert core.histograms == {}


def test_data_parallel_engines_become_separate_cores() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
        'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="100"} 1.0\n'
    )
    a, b = _cores(text)
    assert (a.core, a.kv_cache_usage, a.block_size) == ("0", 0.5, None)
    assert (b.core, b.kv_cache_usage, b.block_size) == ("1", 0.7, 32)


def test_older_servers_gpu_cache_usage_is_accepted_as_kv_usage() -> None:
    (core,) = _cores('vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n')
    assert core.kv_cache_usage == 0.25


def test_page_without_engine_families_is_recognised_as_stats_disabled() -> None:
    page = promtext.parse("# TYPE process_open_fds gauge\nprocess_open_fds 6.0\n")
    assert not vllm_page.has_engine_stats(page)


def test_histogram_without_inf_bucket_is_dropped_not_misread() -> None:
    text = (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1\n'
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    )
    (core,) = _cores(text)
    assert "vllm:e2e_request_latency_seconds" not in core.histograms
