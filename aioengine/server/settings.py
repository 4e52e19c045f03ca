"""``ServerSettings``: the HTTP side's settings, in a module that imports no aiohttp, so that
``python -m aioengine.serve`` can read its arguments and start the engine before the server's
imports (aiohttp, jinja2: a noticeable part of start-up; docs/benchmarks.md) finish."""

from __future__ import annotations

from dataclasses import dataclass

from aioengine.server.tool_parsers import get_parser


@dataclass(frozen=True)
class ServerSettings:
    """HTTP-side settings of ``create_app`` (the engine's are in ``EngineConfig``)."""

    model_name: str | None = None
    """The name clients send as ``model``; defaults to the model's short name (a built-in's
    name, a GGUF file's stem, a directory's name: ``served_model_name``). Requests naming the
    engine's ``config.model`` as given are accepted too."""
    max_request_bytes: int = 4 << 20
    """Bodies over this get a 413."""
    default_max_tokens: int | None = None
    """Chat completions without ``max_tokens``: this many, or up to the context length."""
    health_timeout: float = 5.0
    """Seconds ``/health`` and ``/metrics`` wait for the engine to answer."""
    disconnect_poll_interval: float = 0.2
    """Seconds between checks for HTTP clients that went away (their requests are aborted)."""
    request_timeout: float | None = None
    """Seconds a generation request may take from arrival to its end; past it the request is
    aborted in the engine and answered 504 ``timeout`` (an error event when streaming). A
    request's own ``timeout`` field can only shorten it. None: no limit."""
    api_keys: tuple[str, ...] = ()
    """When any: every route but ``/health`` and ``/metrics`` needs ``Authorization: Bearer``
    with one of these keys (401 otherwise)."""
    protect_health_and_metrics: bool = False
    """With ``api_keys``: ``/health`` and ``/metrics`` need a key too (by default they are open
    for probes and scrapers)."""
    allowed_hosts: tuple[str, ...] | None = None
    """Host names (without port; ``*``: any) the ``Host`` header may name, else 400: a guard
    against DNS rebinding. None: no check (``python -m aioengine.serve`` bound to loopback
    only sets ``localhost``, ``127.0.0.1`` and ``::1``)."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``https://app.example``; ``*``: any) allowed to call the API across
    origins (CORS); none: browsers get no CORS headers and refuse cross-origin calls."""
    allowed_methods: tuple[str, ...] = ("*",)
    """With ``allowed_origins``: the methods a preflight allows."""
    allowed_headers: tuple[str, ...] = ("*",)
    """With ``allowed_origins``: the request headers a preflight allows."""
    allow_credentials: bool = False
    """With ``allowed_origins``: let browsers send cookies / HTTP auth cross-origin."""
    tool_call_parser: str = "hermes"
    """The model family's tool-call format (``aioengine.server.tool_parsers``: ``hermes``/
    ``qwen``, ``llama3_json``): how ``tool_choice: "auto"`` finds the calls in a reply, and
    the format ``required`` and named choices are made to write."""
    strict_request_fields: bool = False
    """Refuse (400) request fields the server does not use; by default they are ignored, logged
    once per name and listed in the ``x-aioengine-ignored-fields`` response header."""
    response_store_max_count: int = 1000
    """Responses the Responses API keeps (``store``: true, its default) for
    ``previous_response_id`` and ``GET /v1/responses/{id}``, in memory; past it the least
    recently used is evicted (its id is then a 400 ``previous_response_not_found``). 0: none."""
    response_store_max_bytes: int = 64 << 20
    """The stored responses' size (their JSON, conversation included) at most; past it the
    least recently used are evicted, and a response bigger than it alone is not kept."""
    max_pooling_inputs: int = 1024
    """Inputs one embedding request (``input``), rerank request (``documents``) or score
    request (pairs) may carry; more is a 400 naming the field. Each is an engine request."""
    shutdown_grace_period: float = 10.0
    """When the app shuts down (its runner's cleanup, also as a mounted sub-app): seconds the
    generations in flight may still run before they are aborted (``finish_reason: "abort"``);
    ``python -m aioengine.serve`` shuts down on SIGTERM or SIGINT."""

    def __post_init__(self) -> None:
        if self.model_name is not None and not self.model_name:
            raise ValueError("model_name must be a non-empty string or None")
        for name in ("max_request_bytes", "default_max_tokens", "max_pooling_inputs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("health_timeout", "disconnect_poll_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be positive, got {self.request_timeout!r}")
        if any(not isinstance(k, str) or not k for k in self.api_keys):
            raise ValueError("api_keys must be non-empty strings")
        if self.protect_health_and_metrics and not self.api_keys:
            raise ValueError("protect_health_and_metrics needs api_keys")
        for name in ("response_store_max_count", "response_store_max_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        get_parser(self.tool_call_parser)  # ValueError naming the known ones
        if not self.shutdown_grace_period >= 0:
            raise ValueError(
                f"shutdown_grace_period must be >= 0, got {self.shutdown_grace_period!r}")
