"""vLLM 0.33's metric families, recreated with prometheus_client as vLLM itself does.

vLLM's ``PrometheusStatLogger`` builds its page with prometheus_client, so
using the same library with the same names, help texts, label names and
bucket bounds gives a page of the same shape as the real one (``_total``,
``_created``, ``le`` formatting and all); ``tests/fixtures`` holds a real page
to compare against.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_REQUEST_SECONDS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
_ITERATION = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_KV_SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


class VllmMetrics:
    """The families of one vLLM server with one engine core (``engine="0"``)."""

    def __init__(self, model_name: str, cache_config: dict[str, str], spec_positions: int = 0) -> None:
        self.registry = r = CollectorRegistry(auto_describe=False)
        base = ["engine", "model_name"]
        self._labels = {"engine": "0", "model_name": model_name}
        lab = self._labels

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, base + list(extra), registry=r)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, base + list(extra), registry=r, multiprocess_mode="mostrecent")

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, base, buckets=buckets, registry=r).labels(**lab)

        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(**lab)
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(**lab)
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(**lab)
        per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ("position",)
        )
        self.spec_accepted_per_pos = [per_pos.labels(**lab, position=str(i)) for i in range(spec_positions)]
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**lab)
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**lab)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            ("reason",),
        )
        self.waiting_capacity = by_reason.labels(**lab, reason="capacity")
        self.waiting_deferred = by_reason.labels(**lab, reason="deferred")
        sleep = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            ("sleep_state",),
        )
        self.sleep_state = {s: sleep.labels(**lab, sleep_state=s) for s in SLEEP_STATES}
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**lab)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(**lab)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lab)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lab)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lab)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(**lab)
        success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.success = {reason: success.labels(**lab, finished_reason=reason) for reason in FINISHED_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        self.rejections = {
            reason: rejections.labels(model_name=model_name, reason=reason)
            for reason in ("max_num_queued_reqs", "max_num_queued_tokens")
        }
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKENS)
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", _TOKENS
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", _ITERATION
        )
        self.request_params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", _TOKENS
        )
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL,
        )
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQUEST_SECONDS)
        self.queue_time = hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQUEST_SECONDS
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", _REQUEST_SECONDS
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _REQUEST_SECONDS
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _REQUEST_SECONDS
        )
        self.request_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            (1, 2, 3, 4, 5, 10, 20),
        )
        self.kv_block_lifetime = hist(
            "vllm:kv_block_lifetime_seconds",
            "Histogram of KV cache block lifetime from allocation to eviction. "
            "Sampled metrics (controlled by --kv-cache-metrics-sample).",
            _KV_SECONDS,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["engine", *sorted(cache_config)],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        info.labels(engine="0", **cache_config).set(1)
        self.set_sleep_level(0)

    def set_sleep_level(self, level: int) -> None:
        self.sleep_state["awake"].set(1 if level == 0 else 0)
        self.sleep_state["weights_offloaded"].set(1 if level == 1 else 0)
        self.sleep_state["discard_all"].set(1 if level == 2 else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
