"""vLLM's start-up arguments as an overlay: base + profile + tuner changes, checked, rendered, diffed.

Engine arguments are fixed for the life of a vLLM server, so every change is
a restart; this module makes sure what a restart would start with is valid
before anything is stopped. Arguments are kept by flag name without dashes
(``"max-num-seqs": 16``); ``True`` renders ``--flag``, ``False`` renders
``--no-flag``, a dict renders compact JSON, and ``None`` in a layer removes
the flag.

Rendering targets the vLLM unit's ``EnvironmentFile``: one variable that
``ExecStart=… vllm serve $VLLM_ARGS`` splits on whitespace, so no value may
contain whitespace (JSON is written without spaces) and the line is quoted
for systemd's parser.
"""

from __future__ import annotations

import json
from typing import Mapping, Union

Value = Union[str, int, float, bool, dict]  # noqa: UP007 (runtime alias)
EngineArgs = dict[str, Value]

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
BACKENDS = ("flash_attn", "triton", "flashinfer")


def block_size_ok(block_size: int, backend: str) -> bool:
    """vLLM's rule: a power of two that the attention backend supports."""
    if block_size <= 0 or block_size & (block_size - 1):
        return False
    if backend == "flashinfer":
        return block_size in (16, 32, 64)
    return block_size % 16 == 0


def valid_block_sizes(backend: str) -> str:
    return "16, 32 or 64" if backend == "flashinfer" else "a power of two from 16 (16, 32, 64, …)"


def overlay(base: Mapping[str, Value | None], *layers: Mapping[str, Value | None]) -> EngineArgs:
    merged: dict[str, Value | None] = dict(base)
    for layer in layers:
        merged.update(layer)
    return {k: v for k, v in merged.items() if v is not None}


def validate(args: Mapping[str, Value], backend: str = "flash_attn") -> list[str]:
    """Every reason vLLM would refuse to start with these arguments (empty: fine)."""
    problems = []

    def integer(name: str, low: int) -> int | None:
        value = args.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"--{name} must be an integer of at least {low}, not {value!r}")
            return None
        return value

    block = integer("block-size", 1)
    if block is not None and not block_size_ok(block, backend):
        problems.append(f"--block-size {block} is refused by the {backend} backend: use {valid_block_sizes(backend)}")
    seqs = integer("max-num-seqs", 1)
    active = integer("max-num-active-seqs", 1)
    if seqs is not None and active is not None and active > seqs:
        problems.append(f"--max-num-active-seqs {active} is above --max-num-seqs {seqs}")
    integer("max-num-batched-tokens", 1)
    model_len = integer("max-model-len", 1)
    chunk = integer("long-prefill-token-threshold", 0)
    if chunk is not None and model_len is not None and chunk > model_len:
        problems.append(f"--long-prefill-token-threshold {chunk} is above --max-model-len {model_len}")
    util = args.get("gpu-memory-utilization")
    if util is not None and (isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1):
        problems.append(f"--gpu-memory-utilization must be in (0, 1], not {util!r}")
    dtype = args.get("kv-cache-dtype")
    if dtype is not None and dtype not in KV_CACHE_DTYPES:
        problems.append(f"--kv-cache-dtype {dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    policy = args.get("scheduling-policy")
    if policy is not None and policy not in ("fcfs", "priority"):
        problems.append(f"--scheduling-policy {policy!r} is not fcfs or priority")
    if "swap-space" in args:
        problems.append("--swap-space no longer exists in vLLM's V1 engine; drop it")
    spec = args.get("speculative-config")
    if spec is not None:
        problems += _speculative(spec)
    for name, value in args.items():
        if any(ch.isspace() for ch in _render(value)):
            problems.append(f"--{name} {value!r} contains whitespace, which the environment file cannot carry")
    return problems


def _speculative(spec: Value) -> list[str]:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError:
            return ["--speculative-config is not JSON"]
    if not isinstance(spec, dict):
        return ["--speculative-config must be a JSON object"]
    problems = []
    if not isinstance(spec.get("method"), str):
        problems.append('--speculative-config needs a "method" (e.g. "ngram", "eagle")')
    tokens = spec.get("num_speculative_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        problems.append("--speculative-config num_speculative_tokens must be an integer of at least 0")
    return problems


def _render(value: Value) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def to_argv(args: Mapping[str, Value]) -> list[str]:
    argv: list[str] = []
    for name in sorted(args):
        value = args[name]
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        else:
            argv += [f"--{name}", _render(value)]
    return argv


def from_argv(argv: list[str]) -> EngineArgs:
    """``to_argv`` read back (what a stand-in for ``vllm serve`` is started with); raises ValueError on a stray value."""
    args: EngineArgs = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("--"):
            raise ValueError(f"{flag!r} is not a --flag")
        name = flag[2:]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raw = argv[i + 1]
            try:
                value: Value = json.loads(raw) if raw[:1] in "{[" or raw.replace(".", "", 1).isdigit() else raw
            except json.JSONDecodeError:
                value = raw
            args[name] = value
            i += 2
        else:
            args[name.removeprefix("no-")] = not name.startswith("no-")
            i += 1
    return args


def to_env_file(args: Mapping[str, Value], variable: str = "VLLM_ARGS") -> str:
    """``VLLM_ARGS="…"`` as systemd's EnvironmentFile parser reads it (\\, ", $ and ` escaped)."""
    line = " ".join(to_argv(args))
    for ch in ("\\", '"', "$", "`"):
        line = line.replace(ch, "\\" + ch)
    return f'# written by vllm-guardian; edits are overwritten at the next restart\n{variable}="{line}"\n'


def diff(old: Mapping[str, Value], new: Mapping[str, Value]) -> list[str]:
    """One line per flag that changes: what a restart would change, for the log."""
    lines = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if before is None:
            lines.append(f"--{name}: (unset) -> {_render(after)}")  # type: ignore[arg-type]
        elif after is None:
            lines.append(f"--{name}: {_render(before)} -> (unset)")
        else:
            lines.append(f"--{name}: {_render(before)} -> {_render(after)}")
    return lines
