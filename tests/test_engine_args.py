from __future__ import annotations

import pytest

from guardian.actions.engine_args import diff, overlay, to_argv, to_env_file, validate

BASE = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max-num-seqs": 16, "block-size": 16, "enable-chunked-prefill": True}


def test_later_layers_win_and_none_removes_a_flag() -> None:
    profile = {"max-num-seqs": 8, "kv-cache-dtype": "fp8"}
    tuner = {"max-num-seqs": 4, "enable-chunked-prefill": None}
    assert overlay(BASE, profile, tuner) == {
        "model": "meta-llama/Llama-3.1-8B-Instruct", "max-num-seqs": 4, "block-size": 16, "kv-cache-dtype": "fp8"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "backend", "problem"),
    [
        ({"block-size": 24}, "flash_attn", "--block-size 24 is refused by the flash_attn backend"),
        ({"block-size": 48}, "triton", "--block-size 48 is refused"),  # a multiple of 16, not a power of two
        ({"block-size": 128}, "flashinfer", "use 16, 32 or 64"),
        ({"max-num-seqs": 0}, "flash_attn", "--max-num-seqs must be an integer of at least 1"),
        ({"max-num-active-seqs": 32}, "flash_attn", "--max-num-active-seqs 32 is above --max-num-seqs 16"),
        ({"gpu-memory-utilization": 1.2}, "flash_attn", "--gpu-memory-utilization must be in (0, 1]"),
        ({"kv-cache-dtype": "int4"}, "flash_attn", "--kv-cache-dtype 'int4' is not one of"),
        ({"swap-space": 8}, "flash_attn", "--swap-space no longer exists"),
        ({"speculative-config": {"num_speculative_tokens": 3}}, "flash_attn", 'needs a "method"'),
        ({"speculative-config": "{oops"}, "flash_attn", "--speculative-config is not JSON"),
        ({"served-model-name": "my model"}, "flash_attn", "contains whitespace"),
        ({"long-prefill-token-threshold": 4096, "max-model-len": 2048}, "flash_attn",
         "--long-prefill-token-threshold 4096 is above --max-model-len 2048"),  # vLLM's SchedulerConfig refuses it
    ],
)
def test_arguments_vllm_would_refuse_are_caught_before_a_restart(changes, backend, problem) -> None:  # type: ignore[no-untyped-def]
    problems = validate(overlay(BASE, changes), backend)
    assert any(problem in p for p in problems), problems


def test_valid_arguments_pass() -> None:
    args = overlay(BASE, {"block-size": 32, "speculative-config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert validate(args, "flashinfer") == []


def test_argv_renders_flags_booleans_and_compact_json() -> None:
    args = {"max-num-seqs": 8, "enable-chunked-prefill": False, "enforce-eager": True,
            "speculative-config": {"method": "ngram", "num_speculative_tokens": 3}}  # fmt: skip
    assert to_argv(args) == [
        "--no-enable-chunked-prefill", "--enforce-eager", "--max-num-seqs", "8",
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}',
    ]  # fmt: skip


def test_env_file_quotes_for_systemd() -> None:
    text = to_env_file({"speculative-config": {"method": "ngram"}, "max-num-seqs": 8})
    assert text.splitlines()[-1] == 'VLLM_ARGS="--max-num-seqs 8 --speculative-config {\\"method\\":\\"ngram\\"}"'


def test_diff_names_every_changed_flag() -> None:
    assert diff(BASE, overlay(BASE, {"max-num-seqs": 8, "kv-cache-dtype": "fp8", "enable-chunked-prefill": None})) == [
        "--enable-chunked-prefill: True -> (unset)",
        "--kv-cache-dtype: (unset) -> fp8",
        "--max-num-seqs: 16 -> 8",
    ]
