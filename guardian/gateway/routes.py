"""What the gateway proxies, and what it never does: an explicit route table in front of vLLM.

vLLM's dev endpoints (``VLLM_SERVER_DEV_MODE=1``: pause, sleep, reset the
prefix cache, server info …) are unauthenticated; guardian needs them on
loopback, clients must never reach them through guardian. So the gateway
proxies only the OpenAI inference paths and the read-only ones a client
needs, plus paths the operator names in ``[gateway] extra_paths``; vLLM's
admin paths are refused even there. The engine's API key goes only on paths
vLLM authenticates (``/v1/…``).
"""

from __future__ import annotations

GENERATE = ("/v1/completions", "/v1/chat/completions")  # POST: bucketed, gated, admitted
READ_ONLY = ("/v1/models",)  # GET: what an OpenAI client asks before it sends
AUTHENTICATED_PREFIXES = ("/v1/", "/v2/", "/inference/", "/cohere/")  # vLLM's --api-key applies to these only

# vLLM's admin, dev and operational paths (0.32/0.33): never proxied, whatever the config says
ADMIN_PATHS = (
    "/pause", "/resume", "/is_paused", "/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache",
    "/reset_mm_cache", "/reset_encoder_cache", "/release_kv_cache_memory", "/server_info", "/collective_rpc",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/start_profile", "/stop_profile", "/update_weights",
    "/init_weight_transfer", "/get_world_size", "/inference/v1/abort_requests", "/metrics", "/health", "/load",
    "/ping", "/version",
)  # fmt: skip


def admin(path: str) -> bool:
    """Whether ``path`` is (under) one of vLLM's admin paths."""
    return any(path == p or path.startswith(p + "/") for p in ADMIN_PATHS)


def authenticated(path: str) -> bool:
    return path.startswith(AUTHENTICATED_PREFIXES)
