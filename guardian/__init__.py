"""vllm-guardian: a sidecar that watches vLLM servers and the GPUs under them."""

__version__ = "0.1.0"
