"""A model of one vLLM V1 engine core, good enough to drive guardian's signals.

What it models, because guardian's detectors and policies depend on it:
- a paged KV pool (``num_gpu_blocks`` × ``block_size``): a sequence holds
  ceil(tokens / block_size) blocks, so the last block of every running
  sequence is partly empty (the internal fragmentation guardian estimates);
- a scheduler with ``max_num_seqs``, a token budget per step (chunked
  prefill), FCFS or priority order, and preemption (recompute) of the newest
  sequence when a running one needs a block and none is free;
- step time that grows with the batch and the prefill tokens, so latency
  responds to load; optional speculative decoding that emits more tokens per
  step at an acceptance rate and costs extra step time;
- vLLM's pause modes and sleep levels.

Pure in the sense guardian needs: time is an argument (``advance(now)``),
randomness comes from a seeded ``random.Random``, and no I/O happens here.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal

from guardian.sim.vllm_metrics import VllmMetrics

TokenListener = Callable[[int, str | None], None]  # (new tokens, finish reason or None)


@dataclass(frozen=True)
class EngineParams:
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    num_gpu_blocks: int = 4096
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0  # a prefill's chunk per step, when others are running or waiting; 0: the budget
    max_model_len: int = 131072
    gpu_memory_utilization: float = 0.92
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    step_base_seconds: float = 0.008
    step_per_seq_seconds: float = 0.0003
    prefill_per_token_seconds: float = 0.00004
    spec_tokens: int = 0  # draft tokens per step; 0 = speculation off
    spec_acceptance: float = 0.7
    spec_overhead: float = 0.2  # step time grows by this fraction with speculation on
    stop_probability: float = 0.004  # per generated token: the model emits EOS
    prefix_cache_hit_ratio: float = 0.2  # share of prompt tokens found in the prefix cache when warm
    prefix_cache_warmup_seconds: float = 60.0  # a cache emptied (a reset, a new engine) fills again over this long

    def cache_config(self) -> dict[str, str]:
        """The labels vLLM 0.33 puts on ``vllm:cache_config_info`` (strings; "None" when unset), all of them."""
        return {
            **CACHE_CONFIG_LABELS,
            "block_size": str(self.block_size),
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "kv_cache_size_tokens": str(self.num_gpu_blocks * self.block_size),
            "num_gpu_blocks": str(self.num_gpu_blocks),
        }


# vllm:cache_config_info's other labels as vLLM 0.33.0 fills them (tests/test_sim_vs_vllm.py keeps them so)
CACHE_CONFIG_LABELS = {
    "_block_size_resolved": "True", "cache_dtype": "auto", "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "None", "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True", "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None", "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None", "kv_offloading_backend": "native", "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False", "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "0",
    "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None", "replayssm_buffer_len": "16", "simple_cpu_offload_num_blocks": "None",
    "skip_page_size_padded": "None", "sliding_window": "None", "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
    "use_replayssm": "False", "user_specified_block_size": "True",
}  # fmt: skip


@dataclass(eq=False)
class SimRequest:
    prompt_tokens: int
    max_tokens: int
    arrival: float
    priority: int = 0
    listener: TokenListener | None = None
    id: int = field(default_factory=itertools.count().__next__)
    kv_tokens: int = 0  # tokens whose KV this request holds in its blocks
    prefill_target: int = 0  # tokens to prefill before decoding: the prompt, after a preemption also the output
    generated: int = 0
    blocks: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    preemptions: int = 0
    finish_reason: str | None = None
    ignore_eos: bool = False  # vLLM's sampling extension: generate exactly max_tokens

    def __post_init__(self) -> None:
        self.prefill_target = self.prompt_tokens

    @property
    def prefilling(self) -> bool:
        return self.kv_tokens < self.prefill_target


class EngineModel:
    def __init__(self, params: EngineParams | None = None, seed: int = 0) -> None:
        self.params = p = params or EngineParams()
        self.rng = random.Random(seed)
        self.clock = 0.0
        self.free_blocks = p.num_gpu_blocks
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.paused: Literal["abort", "wait", "keep"] | None = None
        self.sleep_level = 0
        self.prefix_cold_until = 0.0  # warm from the start, as before; a host's fresh engine starts cold (start_cold)
        self.busy_seconds = 0.0  # time spent in steps: the simulated GPU's utilisation
        self.metrics = VllmMetrics(p.model_name, p.cache_config(), spec_positions=p.spec_tokens)
        self.metrics.kv_usage.set(0)

    # -- requests -------------------------------------------------------------

    def accepts(self) -> str | None:
        """Why a new request would be refused now (vLLM answers 503), or None."""
        if self.sleep_level:
            return "the engine is sleeping"
        return None

    def submit(self, request: SimRequest) -> None:
        p = self.params
        if request.prompt_tokens + request.max_tokens > p.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {p.max_model_len} tokens. However, you requested "
                f"{request.prompt_tokens + request.max_tokens} tokens."
            )
        self.metrics.request_params_max_tokens.observe(request.max_tokens)
        self.waiting.append(request)
        self._publish()

    def abort(self, request: SimRequest) -> None:
        """The client went away: free what the request holds."""
        if request in self.running:
            self.running.remove(request)
            self.free_blocks += request.blocks
            request.blocks = 0
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            return
        self._finish(request, "abort", self.clock)

    # -- the engine loop --------------------------------------------------------

    @property
    def has_work(self) -> bool:
        if self.paused == "keep" or self.sleep_level:
            return False
        return bool(self.running) or (bool(self.waiting) and self.paused in (None, "wait"))

    def advance(self, now: float) -> None:
        """Run engine steps until the engine clock reaches ``now``."""
        while self.clock < now:
            if not self.has_work:
                self.clock = now
                break
            self.clock += self.step(self.clock)
        self._publish()

    def step_once(self) -> float:
        """One step from the engine's own clock, published; returns when it ends (a host driving it in loop time)."""
        self.clock += self.step(self.clock)
        self._publish()
        return self.clock

    def step(self, now: float) -> float:
        """One scheduler iteration starting at ``now``; returns its duration."""
        p = self.params
        budget = p.max_num_batched_tokens
        decoding = [r for r in self.running if not r.prefilling]
        budget -= len(decoding) * (1 + p.spec_tokens)
        prefill: list[tuple[SimRequest, int]] = []
        # vLLM V1: a long prefill's chunk is capped only while another request could use the budget
        cap = p.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        for req in [r for r in self.running if r.prefilling]:
            if budget <= 0:
                break
            chunk = _chunk(req.prefill_target - req.kv_tokens, budget, cap)
            prefill.append((req, chunk))
            budget -= chunk
        if self.paused in (None, "wait"):  # "wait" refuses new requests but finishes the queued ones
            self._admit(now, budget, prefill, cap)
        # grow every sequence's KV; preempt the newest when the pool runs dry
        for req in list(decoding):
            if req in self.running and not self._reserve(req, req.kv_tokens + 1 + p.spec_tokens, now):
                decoding.remove(req)
        for req, chunk in list(prefill):
            if req in self.running and not self._reserve(req, req.kv_tokens + chunk, now):
                prefill.remove((req, chunk))
        decoding = [r for r in decoding if r in self.running]
        prefill = [(r, c) for r, c in prefill if r in self.running]
        prefill_tokens = sum(c for _, c in prefill)
        duration = p.step_base_seconds + p.step_per_seq_seconds * len(decoding) + p.prefill_per_token_seconds * prefill_tokens
        if p.spec_tokens:
            duration *= 1 + p.spec_overhead
        done = now + duration
        emitted = prefill_tokens
        for req in decoding:
            emitted += self._decode(req, duration, done)
        for req, chunk in prefill:
            req.kv_tokens += chunk
            if not req.prefilling:  # the step that finishes prefill samples a token
                if req.first_token_at is None:
                    req.first_token_at = done
                    self.metrics.ttft.observe(done - req.arrival)
                self._emit(req, 1, done)
        self.metrics.iteration_tokens.observe(max(emitted, 1))
        self.busy_seconds += duration
        return duration

    def _admit(self, now: float, budget: int, prefill: list[tuple[SimRequest, int]], cap: int) -> None:
        p = self.params
        order = sorted(self.waiting, key=lambda r: (r.priority, r.arrival)) if p.scheduling_policy == "priority" else list(self.waiting)
        for req in order:
            if budget <= 0 or len(self.running) >= p.max_num_seqs:
                break
            first = req.scheduled_at is None
            # prefix-cache hits are prefilled already: their blocks are held (shared in vLLM), their tokens not computed
            cached = min(int(req.prompt_tokens * self.prefix_hit_ratio(now)), req.prefill_target - 1) if first else 0
            start = max(req.kv_tokens, cached)
            chunk = _chunk(req.prefill_target - start, budget, cap)
            need = math.ceil((start + chunk) / p.block_size)
            if need > self.free_blocks:
                break  # wait for capacity; vLLM does not skip ahead in FCFS
            self.waiting.remove(req)
            self.running.append(req)
            req.kv_tokens = start
            if first:
                req.scheduled_at = now
                self.metrics.queue_time.observe(now - req.arrival)
                self.metrics.prefix_queries.inc(req.prompt_tokens)
                self.metrics.prefix_hits.inc(cached)
                self.metrics.prompt_tokens.inc(req.prompt_tokens)
            prefill.append((req, chunk))
            budget -= chunk

    def _reserve(self, req: SimRequest, tokens: int, now: float) -> bool:
        """Hold enough blocks for ``tokens``; preempt newer sequences for them. False if ``req`` itself was preempted."""
        need = math.ceil(tokens / self.params.block_size) - req.blocks
        while need > self.free_blocks:
            victim = self._victim()
            self._preempt(victim, now)
            if victim is req:
                return False
        if need > 0:
            self.free_blocks -= need
            req.blocks += need
        return True

    def _victim(self) -> SimRequest:
        if self.params.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, req: SimRequest, now: float) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0
        req.kv_tokens = 0  # recompute: the prompt and the output so far are prefilled again
        req.prefill_target = req.prompt_tokens + req.generated
        req.preemptions += 1
        self.metrics.preemptions.inc()
        self.waiting.appendleft(req)

    def _decode(self, req: SimRequest, duration: float, done: float) -> int:
        p = self.params
        tokens = 1
        if p.spec_tokens:
            accepted = 0
            for position in range(p.spec_tokens):
                if self.rng.random() >= p.spec_acceptance:
                    break
                accepted += 1
                self.metrics.spec_accepted_per_pos[position].inc()
            self.metrics.spec_drafts.inc()
            self.metrics.spec_draft_tokens.inc(p.spec_tokens)
            self.metrics.spec_accepted.inc(accepted)
            tokens += accepted
        tokens = min(tokens, req.max_tokens - req.generated)
        for _ in range(tokens):
            self.metrics.itl.observe(duration / tokens)
        req.kv_tokens += tokens
        self._emit(req, tokens, done)
        return tokens

    def _emit(self, req: SimRequest, tokens: int, done: float) -> None:
        """Hand ``tokens`` new tokens to the client; finish on max_tokens or a sampled EOS."""
        req.generated += tokens
        req.last_token_at = done
        self.metrics.generation_tokens.inc(tokens)
        if req.listener is not None:
            req.listener(tokens, None)
        reason = None
        if req.generated >= req.max_tokens:
            reason = "length"
        elif not req.ignore_eos and self.rng.random() < 1 - (1 - self.params.stop_probability) ** tokens:
            reason = "stop"
        if reason is not None:
            self.running.remove(req)
            self.free_blocks += req.blocks
            req.blocks = 0
            self._finish(req, reason, done)

    def _finish(self, req: SimRequest, reason: str, at: float) -> None:
        req.finish_reason = reason
        m = self.metrics
        m.success[reason].inc()
        if reason != "abort":
            m.e2e.observe(at - req.arrival)
            m.request_generation_tokens.observe(req.generated)
            m.request_preemptions.observe(req.preemptions)
            if req.scheduled_at is not None:
                m.inference_time.observe(at - req.scheduled_at)
                first = req.first_token_at or at
                m.prefill_time.observe(first - req.scheduled_at)
                m.request_prompt_tokens.observe(req.prompt_tokens)  # vLLM observes both as the request finishes
                m.decode_time.observe(at - first)
                if req.generated > 1:
                    m.tpot.observe((at - first) / (req.generated - 1))
        if req.listener is not None:
            req.listener(0, reason)

    # -- operational endpoints ---------------------------------------------------

    def pause(self, mode: Literal["abort", "wait", "keep"]) -> None:
        self.paused = mode
        if mode == "abort":
            for req in list(self.running) + list(self.waiting):
                self.abort(req)
        self._publish()

    def resume(self) -> None:
        self.paused = None

    def prefix_hit_ratio(self, now: float) -> float:
        """The share of a prompt found in the prefix cache: the configured ratio once warm, rising from zero after a reset."""
        p = self.params
        if now >= self.prefix_cold_until or p.prefix_cache_warmup_seconds <= 0:
            return p.prefix_cache_hit_ratio
        return p.prefix_cache_hit_ratio * max(0.0, 1 - (self.prefix_cold_until - now) / p.prefix_cache_warmup_seconds)

    def start_cold(self, now: float) -> None:
        """A freshly loaded engine: its prefix cache is empty and fills over ``prefix_cache_warmup_seconds``."""
        self.clock = now
        self.prefix_cold_until = now + self.params.prefix_cache_warmup_seconds

    def reset_prefix_cache(self) -> bool:
        self.prefix_cold_until = self.clock + self.params.prefix_cache_warmup_seconds
        return True

    def sleep(self, level: int) -> None:
        for req in list(self.running) + list(self.waiting):
            self.abort(req)
        self.sleep_level = level
        self.metrics.set_sleep_level(level)

    def wake_up(self) -> None:
        self.sleep_level = 0
        self.metrics.set_sleep_level(0)

    # -- what the outside sees ---------------------------------------------------

    @property
    def used_blocks(self) -> int:
        return self.params.num_gpu_blocks - self.free_blocks

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.params.num_gpu_blocks

    def internal_waste_slots(self) -> int:
        """The truth guardian's fragmentation estimate is held against: empty slots in held blocks."""
        bs = self.params.block_size
        return sum(r.blocks * bs - r.kv_tokens for r in self.running)

    def truth(self) -> dict[str, float | int]:
        """What only the simulator knows, for tests and ``GET /sim/state``."""
        used_slots = self.used_blocks * self.params.block_size
        waste = self.internal_waste_slots()
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "used_blocks": self.used_blocks,
            "block_size": self.params.block_size,
            "internal_waste_slots": waste,
            "kv_internal_fragmentation_ratio": waste / used_slots if used_slots else 0.0,
        }

    def _publish(self) -> None:
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.waiting_capacity.set(len(self.waiting))
        m.waiting_deferred.set(0)
        m.kv_usage.set(self.kv_usage)


def _chunk(left: int, budget: int, cap: int) -> int:
    """The prompt tokens one request computes in a step: what is left, within the budget and the long-prefill cap (0: none)."""
    return min(left, budget, cap) if cap > 0 else min(left, budget)
