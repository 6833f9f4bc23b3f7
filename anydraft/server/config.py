"""`ServerConfig`: the settings of one server app (`create_app`), read from the options of
`anydraft serve` (options.py `server_config`) or given directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..planning.settings import SETTINGS


@dataclass
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_queue: int = 64
    max_queued_per_client: int | None = None  # None: scheduler.fair_share(max_queue)
    max_batch: int = 1  # generations each worker runs together (continuous batching)
    min_read: int = SETTINGS.min_prefill  # the fewest prompt tokens a batch's step reads for joining requests
    max_body_bytes: int = 2 * 2**20
    body_timeout: float = 30.0  # seconds to receive a whole request body (slow uploads: 408)
    request_timeout: float | None = None  # wall-clock seconds per request, from its arrival
    max_prompt_tokens: int | None = None
    default_max_tokens: int = 256  # chat; completions default to OpenAI's 16
    owned_by: str = "anydraft"
    # addresses (ip_network) whose X-Forwarded-For is believed; nobody else's is
    trusted_proxies: tuple = ()
    # Host names accepted: None = loopback names only (the safe default); "*" = any
    allowed_hosts: tuple[str, ...] | None = None
    cors_origins: tuple[str, ...] = field(default_factory=tuple)  # empty: no CORS headers
    replica: str | None = None  # a Ray Serve replica's id: a `replica` label on every metric
    stats: str | None = None  # --stats: the learned statistics are written here at shutdown
    shutdown_timeout: float = 30.0  # --shutdown-timeout: seconds a drain lets requests finish
    max_connections: int = 256  # open connections served (connections.py)
    max_connections_per_client: int | None = None  # None: fair_share(max_connections)
    head_timeout: float = 5.0  # seconds a connection has to send a complete request head
    # --allow-special-in-content: special tokens typed in messages act as control tokens
    allow_special_in_content: bool = False
