"""vLLM's ``/metrics`` page → one ``CoreReading`` per engine core.

Pure: text in, readings out. The extractor does not depend on the order or
presence of families (pages differ across vLLM versions, data parallel and
multiprocess mode); a family that is absent stays ``None``.
"""

from __future__ import annotations

import math

from guardian.sample import CoreReading, Histogram
from guardian.sources.promtext import Labels, Page

PREFIX = "vllm:"
# per-request histograms vLLM observes as each request finishes: only their sums are kept (what prefill cost
# the prompt tokens of the same requests), read with the latency histograms
PREFILL_TIME, PROMPT_TOKENS = "vllm:request_prefill_time_seconds", "vllm:request_prompt_tokens"

# reading field -> the vLLM families it may come from, newest name first
_SCALARS: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "prefill_seconds_total": (PREFILL_TIME + "_sum",),
    "finished_prompt_tokens_total": (PROMPT_TOKENS + "_sum",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "requests_finished_total": ("vllm:request_success_total",),  # summed over finished_reason
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total",),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total",),
    "spec_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens_total",),
}

# histograms guardian derives latency quantiles from, by short name
LATENCY_HISTOGRAMS: dict[str, str] = {
    "e2e": "vllm:e2e_request_latency_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
}
# the histograms a CoreReading carries: the latencies, which guardian reads (the page has
# ~20; parsing and assembling the others, request lengths among them, every poll would be
# most of a poll's cost for nothing)
HISTOGRAMS = tuple(LATENCY_HISTOGRAMS.values())
# every family the extractor reads, as named on the page's HELP lines: the
# scraper parses only these (a vLLM page has ~130 families)
FAMILIES = frozenset(
    [name.removesuffix("_sum") for names in _SCALARS.values() for name in names]  # a histogram's sum: its family
    + list(HISTOGRAMS)
    + ["vllm:engine_sleep_state", "vllm:cache_config_info"]
)
FAMILIES_WITHOUT_LATENCY = FAMILIES - frozenset(HISTOGRAMS) - {PREFILL_TIME, PROMPT_TOKENS}


def has_engine_stats(page: Page) -> bool:
    """False for a server started with ``--disable-log-stats``: no vLLM engine families at all."""
    return any(name.startswith(PREFIX) and name != "vllm:cache_config_info" for name in page.samples)


def cores_from_page(page: Page) -> tuple[CoreReading, ...]:
    cores: dict[str, dict[str, object]] = {}

    def core(labels: Labels) -> dict[str, object]:
        key = labels.get("engine", "")
        found = cores.get(key)
        if found is None:
            found = cores[key] = {"core": key, "histograms": {}}
        if "model_name" not in found and "model_name" in labels:
            found["model_name"] = labels["model_name"]
        return found

    for field_name, names in _SCALARS.items():
        for name in names:
            entries = page.get(name)
            if not entries:
                continue
            for labels, value in entries:
                target = core(labels)
                if math.isfinite(value):
                    # several series per core (finished_reason, …) add up
                    target[field_name] = float(target.get(field_name) or 0.0) + value  # type: ignore[arg-type]
            break

    for labels, value in page.get("vllm:engine_sleep_state"):
        if labels.get("sleep_state") == "awake":
            core(labels)["sleeping"] = value == 0

    for labels, _ in page.get("vllm:cache_config_info"):
        core(labels)["cache_config"] = labels  # the parser's own dict (read-only, shared between polls): ~40 labels not copied

    for name in HISTOGRAMS:
        for (engine, model), hist in _histograms(page, name).items():
            target = cores.get(engine) or core({"engine": engine, "model_name": model})
            target["histograms"][name] = hist  # type: ignore[index]

    return tuple(CoreReading(**fields) for _, fields in sorted(cores.items()))  # type: ignore[arg-type]


def _histograms(page: Page, name: str) -> dict[tuple[str, str], Histogram]:
    """Histograms of one family keyed by (engine, model_name)."""
    entries = page.get(name + "_bucket")
    if not entries:
        return {}
    layout = _layout([labels for labels, _ in entries])
    counts = [value for _, value in entries]
    totals = {_series(labels): value for labels, value in page.get(name + "_count")}
    sums = {_series(labels): value for labels, value in page.get(name + "_sum")}
    created = {_series(labels): value for labels, value in page.get(name + "_created")}
    return {
        key: Histogram(buckets=tuple(zip(bounds, [counts[i] for i in order])), count=totals.get(key), sum=sums.get(key),
                       created=created.get(key))
        for key, bounds, order in layout
    }  # fmt: skip


# a family's bucket series are the same label sets every poll (the parser hands out the same dicts):
# where each series' buckets sit and their bounds are worked out once per layout, not per bucket per poll
_LAYOUTS: dict[tuple[int, ...], tuple[list[Labels], list[tuple[tuple[str, str], tuple[float, ...], list[int]]]]] = {}
_MAX_LAYOUTS = 1024


def _layout(labels: list[Labels]) -> list[tuple[tuple[str, str], tuple[float, ...], list[int]]]:
    """Per series of a histogram family with a ``+Inf`` bucket: its key, its bounds in order, and where its counts are."""
    ids = tuple(map(id, labels))
    found = _LAYOUTS.get(ids)
    if found is not None:
        return found[1]
    by_key: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for i, series in enumerate(labels):
        le = series.get("le")
        if le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        by_key.setdefault(_series(series), []).append((bound, i))
    layout = []
    for key, items in by_key.items():
        items.sort()  # prometheus_client writes them in order; others may not
        if items[-1][0] == math.inf:  # else not a usable histogram
            layout.append((key, tuple(b for b, _ in items), [i for _, i in items]))
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    _LAYOUTS[ids] = (labels, layout)  # the label dicts kept alive: their ids cannot be reused while cached
    return layout


def _series(labels: Labels) -> tuple[str, str]:
    return labels.get("engine", ""), labels.get("model_name", "")
