"""FastAPI app: the OpenAI routes over a `Scheduler` of decoders, with OpenAI-style errors.

Every failure a client can cause is an `ApiError` -> ``{"error": {message, type, param, code}}``
with a 4xx status; bodies are parsed here (not by FastAPI) so that invalid UTF-8, invalid
JSON, oversize bodies and type errors all get the same error shape. Our own failures are 500s
whose message carries an error id that the log line of the failure carries too.

Only JSON bodies are taken, and (bound to loopback) only loopback Host names, so a web page a
user visits cannot drive, or through DNS rebinding read, a local server without a key.

``GET /`` is the playground (static/playground.html, issue 23): a page that streams an answer
with each span colored by its origin (`Generation.piece`); it holds no secret, so it is served
without the key, and asks for the key itself to call the API.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from ..config import override
from ..errors import AnydraftError
from ..planning.settings import SETTINGS
from ..sampling import SamplingParams
from .connections import ALWAYS, Connections, is_loopback
from .metrics import Metrics
from .scheduler import DecodingFailed, Job, QueueFull, Scheduler, SchedulerClosed, fair_share
from .schemas import ChatCompletionRequest, CompletionRequest
from .workers import public_name, save_stats

log = logging.getLogger("anydraft.server")

# anydraft finish reasons -> OpenAI's ("context": the window filled up before max_tokens;
# "timeout": --request-timeout passed; both are a cut-short answer, as "length" says)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
                  "timeout": "length"}
DISCONNECT_POLL = 0.25  # seconds between checks that the client is still there
DRAIN_POLL = 0.05  # seconds between checks, while draining, that every request has ended
ENDPOINTS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/",
             "/playground.js"}
# answered without the API key (none shows anything secret; /health only its status)
PUBLIC = {"/health", "/", "/playground.js"}
PLAYGROUND = Path(__file__).parent / "static" / "playground.html"
PLAYGROUND_SCRIPT = PLAYGROUND.with_suffix(".js")
# the page may run only its own script file (no inline script: an injected one cannot run),
# load nothing from anywhere else, call only this server, and not be framed by another site
PLAYGROUND_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache"}
# a log-probability JSON cannot carry (-inf: a token the sampling settings ruled out), as
# vLLM spells it
LOGPROB_FLOOR = -9999.0
OPENAI_SAMPLING = SamplingParams(temperature=1.0)  # what a request leaves out (OpenAI's defaults)


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


def client_of(scope, trusted_proxies) -> str:
    """The client a request counts against: the peer address, or, when the peer is a trusted
    proxy, the nearest X-Forwarded-For address that is not one."""
    peer = scope["client"][0] if scope.get("client") else "-"
    if not trusted_proxies or not _trusted(peer, trusted_proxies):
        return peer
    forwarded = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
    hops = [h.strip() for h in ",".join(forwarded).split(",") if h.strip()]
    for hop in reversed(hops):  # the right end was added by our own proxies
        if not _trusted(hop, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def _trusted(address: str, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return any(ip in net for net in networks)


def host_name(scope) -> str | None:
    """The Host header without its port, lower-case; None if absent."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):  # [::1]:8000
                return host[1:host.find("]")] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


def internal_error(exc: BaseException, what: str = "generation failed") -> ApiError:
    """A 500 whose error id also starts the one log line (with traceback) of the failure."""
    error_id = "err-" + uuid.uuid4().hex[:16]
    cause = exc.__cause__ if isinstance(exc, DecodingFailed) and exc.__cause__ else exc
    log.error("%s: %s [%s]", error_id, what, type(cause).__name__, exc_info=cause)
    return ApiError(500, f"internal error {error_id} ({type(cause).__name__}): the server log "
                         "has the details under this id", type="server_error", code="internal_error")


def _validation_error(exc: ValidationError) -> ApiError:
    err = exc.errors(include_url=False)[0]
    # unions and validators add tags to loc ("str", "list[str]", "function-after[...]")
    tags = {"str", "int", "float", "bool", "dict", "list"}
    loc = [str(p) for p in err.get("loc", ())]
    param = ".".join(p for p in loc if p not in tags and "[" not in p)
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):  # our own model validators: "field: why"
        msg = msg[len("Value error, "):]
        field, sep, _ = msg.partition(": ")
        if sep and field.isidentifier():
            param = param or field
    count = len(exc.errors())
    more = f" (and {count - 1} more error{'s' if count > 2 else ''})" if count > 1 else ""
    where = f"{param}: " if param and not msg.startswith(f"{param}:") else ""
    return ApiError(400, f"{where}{msg}{more}", param=param or None, code="invalid_value")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def parse_body(request: Request, model_cls, max_bytes: int, timeout: float | None = None):
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        # a web page can POST text/plain or form bodies to a local server without a CORS
        # preflight; JSON is what every OpenAI client sends
        raise ApiError(415, f"Content-Type must be application/json, got {media_type or 'none'!r}: "
                            "send the body as JSON with 'Content-Type: application/json'",
                       code="unsupported_media_type")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ApiError(413, f"request body is {length} bytes; the limit is {max_bytes}",
                       code="request_too_large")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes",
                                   code="request_too_large")
    except ClientDisconnect:
        log.info("client %s disconnected while sending its request body",
                 request.client.host if request.client else "-")
        raise ClientGone() from None
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout:g} s",
                       code="request_timeout") from None
    if not body:
        raise ApiError(400, "request body is empty: send a JSON object", code="invalid_json")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (at byte {exc.start})",
                       code="invalid_encoding") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    try:  # lone surrogates ("\ud800") are valid JSON but not text any tokenizer can take
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "request contains an unpaired UTF-16 surrogate (\\ud800-\\udfff)",
                       code="invalid_encoding") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def sampling_of(req, vocabulary: int) -> SamplingParams:
    """The request's sampling settings, validated by `SamplingParams` (400 naming the field),
    its logit bias against the model's ``vocabulary`` (logits width)."""
    try:
        params = override(OPENAI_SAMPLING, **req.sampling_fields)
        params.check_vocabulary(vocabulary)
        return params
    except AnydraftError as exc:  # "invalid sampling settings: top_p must be ..."
        field = str(exc).partition(": ")[2].split(" ", 1)[0]
        param = field if field in {f.name for f in fields(SamplingParams)} else None
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


class _Tagged:
    """A request's event queue as one of its jobs sees it: each event tagged with the job's
    choice index (the ``n`` completions of one request share one queue)."""

    def __init__(self, queue: asyncio.Queue, index: int):
        self.queue, self.index = queue, index

    def put_nowait(self, event: tuple) -> None:
        self.queue.put_nowait((self.index, *event))


@dataclass(eq=False)
class Choices:
    """One request's jobs, one per completion (``n``), and the events they share."""

    jobs: list[Job]
    events: asyncio.Queue
    checked_at: float = 0.0  # loop time of the handler's last check that the client is there


def _user_error(exc: BaseException, prompt_param: str | None = None) -> ApiError:
    """An exception from a generation job, as the error the client sees: 4xx for what the
    request caused (found before decoding starts), 500 with an error id for the rest."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DecodingFailed):
        return internal_error(exc)
    if isinstance(exc, AnydraftError):
        msg = str(exc)
        code = "context_length_exceeded" if "context window" in msg else "invalid_value"
        param = prompt_param if msg.startswith("prompt") else None
        return ApiError(400, msg, param=param, code=code)
    if type(exc).__module__.startswith("jinja2"):  # the chat template refused the messages
        return ApiError(400, f"the chat template rejected the messages: {exc}", param="messages",
                        code="invalid_messages")
    if isinstance(exc, SchedulerClosed):
        return ApiError(503, str(exc), type="server_error", code="shutting_down",
                        headers={"Retry-After": "5"})
    return internal_error(exc)


class Gate:
    """ASGI middleware: the Host check, bearer auth (except `PUBLIC` paths) and per-endpoint
    request metrics (499 for a client that left, streaming or not)."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics, connections: Connections):
        self.app, self.config, self.metrics, self.connections = app, config, metrics, connections
        self._key = config.api_key.encode() if config.api_key else None

    def _host_allowed(self, scope) -> bool:
        allowed = self.config.allowed_hosts
        if allowed is not None and "*" in allowed:
            return True
        host = host_name(scope)
        if host is None:
            return False
        host = host.rstrip(".")
        return is_loopback(host) if allowed is None else host in allowed

    async def _refuse(self, err: ApiError, scope, receive, send, headers=None):
        self.metrics.errors.labels(err.type, err.code or "").inc()
        await JSONResponse(err.body(), status_code=err.status, headers=headers)(scope, receive, send)

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        scope.setdefault("state", {})["arrived"] = start = time.perf_counter()
        status = [0]

        async def send_tracked(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"x-content-type-options" for name, _ in headers):
                    # a browser must not read a JSON error (or anything else) as HTML
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            if self.connections.total > self.connections.max_total and path not in ALWAYS:
                err = ApiError(503, f"the server has more than {self.connections.max_total} open "
                                    "connections (--max-connections): try again later",
                               type="server_error", code="too_many_connections")
                await self._refuse(err, scope, receive, send_tracked, {"Retry-After": "1"})
            elif not self._host_allowed(scope):
                err = ApiError(400, f"Host {host_name(scope)!r} is not served here: use a loopback "
                                    "address, or start the server with --allowed-hosts",
                               code="invalid_host")
                await self._refuse(err, scope, receive, send_tracked)
            elif self._key is not None and path not in PUBLIC and not self._authorized(scope):
                err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
                await self._refuse(err, scope, receive, send_tracked, {"WWW-Authenticate": "Bearer"})
            else:
                # /health shows its details to key holders only (`health`)
                scope["state"]["authorized"] = self._key is None or self._authorized(scope)
                await self.app(scope, receive, send_tracked)
        except ClientDisconnect:  # a response could not be sent: its client left
            scope["state"]["client_gone"] = True
        except Exception as exc:  # a bug of ours: one log line and a 500 (not uvicorn's second
            # traceback, which Starlette's error middleware would add by re-raising it)
            err = internal_error(exc, f"{scope.get('method')} {path} failed")
            if not status[0]:
                await self._refuse(err, scope, receive, send_tracked)
            status[0] = status[0] or 500
        finally:
            gone = scope["state"].get("client_gone")  # set by a stream whose client left
            self.metrics.requests.labels(endpoint, "499" if gone else str(status[0] or 499)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)


def create_app(decoders: list, config: ServerConfig) -> FastAPI:
    """The app serving ``decoders`` (one worker thread each; they should share one model)."""
    scheduler = Scheduler(decoders, config.max_queue, config.max_queued_per_client, config.max_batch,
                          config.min_read)
    metrics = Metrics(scheduler, model=config.model_id, replica=config.replica)
    per_client = config.max_connections_per_client
    connections = Connections(config.max_connections,
                              fair_share(config.max_connections) if per_client is None else per_client,
                              config.head_timeout, config.trusted_proxies)
    dec0 = decoders[0]
    ctx = dec0.target.context_window
    vocabulary = dec0.target.logits_width
    table, tokenizer = dec0.table, dec0.target.tokenizer  # logprobs' tokens as text
    page = PLAYGROUND.read_text(encoding="utf-8")
    script = PLAYGROUND_SCRIPT.read_text(encoding="utf-8")
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.close)
            if config.stats:
                await asyncio.to_thread(save_stats, decoders, config.stats)

    async def drain() -> None:
        """Stop taking requests (503 with Retry-After), let the accepted ones finish for up to
        ``config.shutdown_timeout`` s, then end the rest (each open stream with an error event
        and [DONE], one log line each: `Scheduler.close`). shutdown.py calls it on SIGTERM."""
        scheduler.stop_taking()
        log.warning("shutting down: %d requests running, %d waiting; they have %g s to finish",
                    scheduler.active, scheduler.waiting, config.shutdown_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.shutdown_timeout
        while (scheduler.active or scheduler.waiting) and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL)
        await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="anydraft", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.scheduler, app.state.metrics, app.state.config = scheduler, metrics, config
    app.state.drain = drain
    app.state.connections = connections  # its `protocol()` is what uvicorn runs (cli.py)

    def error_response(err: ApiError) -> JSONResponse:
        metrics.errors.labels(err.type, err.code or "").inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(ClientGone)
    async def _client_gone(request, exc):
        return Response(status_code=499)  # nobody reads it; recorded in the metrics

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ApiError(exc.status_code, msg, code=code,
                                       headers=getattr(exc, "headers", None)))

    app.add_middleware(Gate, config=config, metrics=metrics, connections=connections)
    if config.cors_origins:  # outside the Gate: a browser's preflight carries no API key
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "HEAD"],
                           allow_headers=["Authorization", "Content-Type"])

    # -- helpers ---------------------------------------------------------------------------
    async def next_event(request: Request, choices: Choices, deadline: float | None = None):
        """The next ``(choice index, kind, payload)`` of the request's jobs; raises
        `ClientGone` once the client has disconnected (checked at least every
        `DISCONNECT_POLL` s, whether or not events keep coming), and `TimeoutError` once the
        perf_counter time ``deadline`` has passed."""
        loop = asyncio.get_running_loop()
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                raise TimeoutError()
            if loop.time() - choices.checked_at >= DISCONNECT_POLL:
                choices.checked_at = loop.time()
                if await request.is_disconnected():
                    raise ClientGone()
            try:
                return await asyncio.wait_for(choices.events.get(), timeout=DISCONNECT_POLL)
            except TimeoutError:
                pass

    def check_request(req) -> int:
        if req.model != config.model_id:
            raise ApiError(404, f"model {req.model!r} does not exist: this server serves "
                                f"{config.model_id!r} (see GET /v1/models)",
                           param="model", code="model_not_found")
        max_tokens = req.requested_max_tokens
        if max_tokens is not None and max_tokens > ctx:
            raise ApiError(400, f"max_tokens is {max_tokens} but the model's context window is "
                                f"{ctx} tokens: ask for fewer", param="max_tokens",
                           code="context_length_exceeded")
        if req.choices > scheduler.most_at_once:
            raise ApiError(400, f"n is {req.choices}, but this server runs or queues at most "
                                f"{scheduler.most_at_once} completions of one request: ask for "
                                "fewer", param="n", code="invalid_value")
        return max_tokens

    def end(choices: Choices, finished: list, failed: int | None = None) -> None:
        """The response ended before every choice finished (``failed``: the one that failed,
        if one did): stop the others and count them."""
        for i, job in enumerate(choices.jobs):
            if not finished[i]:
                scheduler.cancel(job)
                metrics.generations.labels("error" if i == failed else "cancelled").inc()

    async def run(request: Request, req, chat: bool) -> Choices:
        """Queue the request's generations (``n``, one job each) and wait for one to start;
        returns them (or raises ApiError)."""
        max_tokens = check_request(req)
        if max_tokens is None:
            max_tokens = min(config.default_max_tokens if chat else 16, ctx)
        prompt = [m.as_template_message() for m in req.messages] if chat else req.prompt_text
        prompt_param = "messages" if chat else "prompt"
        sampling = sampling_of(req, vocabulary)
        kwargs = dict(max_new_tokens=max_tokens, chat=chat, stop=req.stop_list,
                      method=req.anydraft_method, special_in_content=config.allow_special_in_content,
                      logprobs=req.top_alternatives)

        def starter(params: SamplingParams):
            def start(decoder, rows, job: Job):  # what fails here is the request's fault
                generation = decoder.start(prompt, rows=rows, cancel=job.stop_reason,
                                           sampling=params, **kwargs)
                limit = config.max_prompt_tokens
                if limit is not None and generation.prompt_tokens > limit:
                    generation.leave()
                    raise ApiError(400, f"prompt has {generation.prompt_tokens} tokens; this "
                                        f"server takes at most {limit}: shorten it",
                                   param=prompt_param, code="context_length_exceeded")
                return generation
            return start

        client = client_of(request.scope, config.trusted_proxies)
        arrived = request.scope.get("state", {}).get("arrived", time.perf_counter())
        deadline = arrived + config.request_timeout if config.request_timeout else None
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        choices = Choices([Job(starter(sampling.for_choice(i)), loop, client=client,
                               deadline=deadline, events=_Tagged(events, i))
                           for i in range(req.choices)], events)
        try:
            scheduler.submit(*choices.jobs)
        except QueueFull as exc:
            if exc.per_client:
                raise ApiError(429, f"{exc}: you already have {scheduler.max_per_client} requests "
                                    "waiting, the most one client may queue",
                               type="rate_limit_error", code="client_queue_full",
                               headers={"Retry-After": str(exc.retry_after)}) from None
            raise ApiError(429, f"{exc}: the queue is full ({config.max_queue} waiting)",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after)}) from None
        except SchedulerClosed as exc:
            raise _user_error(exc) from None
        # the choices start alike (one prompt, one set of settings): the first to start or
        # fail tells whether the request was good
        try:
            index, kind, payload = await next_event(request, choices, deadline)
            if kind == "error":
                raise _user_error(payload, prompt_param)
        except BaseException as exc:
            for job in choices.jobs:  # the others, still queued or running
                scheduler.cancel(job)
            if isinstance(exc, ClientGone):  # gave up while queued or starting
                metrics.generations.labels("cancelled").inc()
            if isinstance(exc, TimeoutError):
                metrics.generations.labels("timeout").inc()
                raise ApiError(503, f"no worker was free within the request timeout of "
                                    f"{config.request_timeout:g} s: try again later",
                               type="server_error", code="timeout",
                               headers={"Retry-After": "5"}) from None
            raise
        assert kind == "started", kind
        job = choices.jobs[index]
        metrics.queue_wait.observe((job.started_at or time.perf_counter()) - job.enqueued_at)
        return choices

    def finish(request: Request, out) -> tuple[str, dict, dict]:
        stats = dict(out.stats)
        reason = FINISH_REASONS.get(out.finish_reason, out.finish_reason)
        metrics.record_generation(stats, out.finish_reason)
        stats["finish_reason"] = out.finish_reason
        usage = {"prompt_tokens": stats.get("prompt_tokens", 0),
                 "completion_tokens": stats.get("new_tokens", len(out.token_ids))}
        return reason, usage, stats

    def total_usage(usages: list[dict]) -> dict:
        """One request's usage: its prompt once, every choice's completion."""
        prompt = usages[0]["prompt_tokens"]
        completion = sum(u["completion_tokens"] for u in usages)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def logprobs_json(entries: list, chat: bool, offset: int = 0) -> tuple[dict, int]:
        """``entries`` (`TokenLogprob`s) as OpenAI writes a choice's ``logprobs``: chat's
        ``content`` list, or completions' parallel lists (``text_offset`` counted from
        ``offset`` characters); and the offset after them."""
        def token(t: int) -> tuple[str, list[int]]:
            special = t >= len(table.token_bytes) or t in table.special_ids
            spelt = (tokenizer.convert_ids_to_tokens(t) or "").encode() if special else table.token_bytes[t]
            return spelt.decode("utf-8", errors="replace"), list(spelt)

        def logprob(value: float) -> float:
            return max(value, LOGPROB_FLOOR)

        if chat:
            def entry(t: int, value: float, **more) -> dict:
                text, spelt = token(t)
                return {"token": text, "logprob": logprob(value), "bytes": spelt, **more}

            content = [entry(e.token, e.logprob, top_logprobs=[entry(t, v) for t, v in e.top])
                       for e in entries]
            return {"content": content, "refusal": None}, offset
        texts, starts = [token(e.token) for e in entries], []
        for text, _ in texts:
            starts.append(offset)
            offset += len(text)
        return {"tokens": [text for text, _ in texts],
                "token_logprobs": [logprob(e.logprob) for e in entries],
                "top_logprobs": [{token(t)[0]: logprob(v) for t, v in e.top} for e in entries],
                "text_offset": starts}, offset

    def first_token(request: Request):
        arrived = request.scope.get("state", {}).get("arrived")
        if arrived is not None:
            metrics.ttft.observe(time.perf_counter() - arrived)

    async def complete(request: Request, req, chat: bool):
        choices = await run(request, req, chat)
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        now = int(time.time())
        if req.stream:
            return StreamingResponse(
                sse(request, req, choices, chat, cid, now), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        n = len(choices.jobs)
        parts, outputs, failed = [[] for _ in range(n)], [None] * n, None
        try:
            while None in outputs:
                index, kind, payload = await next_event(request, choices)
                if kind == "delta" and payload.text:
                    if not any(parts):
                        first_token(request)
                    parts[index].append(payload.text)
                elif kind == "done":
                    outputs[index] = payload
                elif kind == "cancelled":
                    raise ClientGone()
                elif kind == "error":
                    failed = index
                    raise _user_error(payload)
        finally:
            end(choices, outputs, failed)
        body, usages, all_stats = [], [], []
        for index, out in enumerate(outputs):
            reason, usage, stats = finish(request, out)
            usages.append(usage)
            all_stats.append(stats)
            text = "".join(parts[index])
            logprobs = None if out.logprobs is None else logprobs_json(out.logprobs, chat)[0]
            if chat:
                body.append({"index": index, "message": {"role": "assistant", "content": text},
                             "logprobs": logprobs, "finish_reason": reason})
            else:
                body.append({"index": index, "text": text, "logprobs": logprobs,
                             "finish_reason": reason})
        return {"id": cid, "object": "chat.completion" if chat else "text_completion",
                "created": now, "model": config.model_id, "system_fingerprint": None,
                "choices": body, "usage": total_usage(usages),
                "anydraft": all_stats[0] if n == 1 else {"choices": all_stats}}

    async def sse(request: Request, req, choices: Choices, chat: bool, cid: str, now: int):
        obj = "chat.completion.chunk" if chat else "text_completion"

        n = len(choices.jobs)
        offsets = [0] * n  # per choice: characters its tokens' logprobs spelt so far

        def chunk(index: int, piece: str | None, reason=None, tokens=(), **extra) -> str:
            logprobs = None
            if tokens:  # log-probabilities of the piece's tokens
                logprobs, offsets[index] = logprobs_json(tokens, chat, offsets[index])
            if chat:
                delta = {} if piece is None else {"content": piece}
                if extra.pop("role", False):
                    delta["role"] = "assistant"
                choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            else:
                choice = {"index": index, "text": piece or "", "logprobs": logprobs,
                          "finish_reason": reason}
            body = {"id": cid, "object": obj, "created": now, "model": config.model_id,
                    "system_fingerprint": None, "choices": [choice], **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        usages, failed, first = [None] * n, None, True
        steps = [[] for _ in range(n)]  # per choice: the last steps that showed no text
        tokens = [[] for _ in range(n)]  # and their tokens' log-probabilities
        ended = False  # the response ended as it should: every choice done, or an error sent
        try:
            if chat:
                for index in range(n):
                    yield chunk(index, "", role=True)
            while None in usages:
                index, kind, payload = await next_event(request, choices)
                if kind == "delta" and not payload.text:
                    steps[index] += payload.steps
                    tokens[index] += payload.logprobs
                elif kind == "delta":
                    if first:
                        first_token(request)
                        first = False
                    spans = [{"text": text, "origin": origin} for text, origin in payload.spans]
                    yield chunk(index, payload.text, tokens=payload.logprobs,
                                anydraft={"spans": spans, "steps": payload.steps})
                elif kind == "done":
                    reason, usages[index], stats = finish(request, payload)
                    extra = {"anydraft": {**stats, "steps": steps[index]}}
                    if None not in usages and not req.include_usage:
                        extra["usage"] = total_usage(usages)  # on the chunk the client sees last
                    yield chunk(index, None, reason, tokens=tokens[index], **extra)
                elif kind == "cancelled":
                    return
                elif kind == "error":
                    ended, failed = True, index
                    err = _user_error(payload)
                    metrics.errors.labels(err.type, err.code or "").inc()
                    yield f"data: {json.dumps(err.body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
            ended = True
            if req.include_usage:
                body = {"id": cid, "object": obj, "created": now, "model": config.model_id,
                        "choices": [], "usage": total_usage(usages)}
                yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        except ClientGone:
            return  # nobody to send to; the finally below frees the workers
        finally:
            if not ended:  # the client left (or the server is stopping): recorded as 499
                request.scope.setdefault("state", {})["client_gone"] = True
            end(choices, usages, failed)

    # -- routes ----------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse_body(request, ChatCompletionRequest, config.max_body_bytes,
                               config.body_timeout)
        return await complete(request, req, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parse_body(request, CompletionRequest, config.max_body_bytes,
                               config.body_timeout)
        return await complete(request, req, chat=False)

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(page, headers=PLAYGROUND_HEADERS)

    @app.get("/playground.js")
    async def playground_script():
        return Response(script, media_type="text/javascript; charset=utf-8", headers=PLAYGROUND_HEADERS)

    @app.get("/v1/models")
    async def models():
        drafter = decoders[0].drafter
        return {"object": "list", "data": [{
            "id": config.model_id, "object": "model", "created": created,
            "owned_by": config.owned_by,
            "anydraft": {"target": public_name(dec0.target.name),
                         "drafter": public_name(drafter.name) if drafter else None,
                         "method": dec0.draft.method, "context_window": ctx, "workers": len(decoders),
                         "max_batch": config.max_batch},
        }]}

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health(request: Request):
        body = {"status": "ok" if scheduler.taking else "shutting down"}
        if request.scope["state"].get("authorized"):  # no --api-key, or the key was sent
            body |= {
                "model": config.model_id, "waiting": scheduler.waiting, "active": scheduler.active,
                "workers": len(decoders), "max_batch": config.max_batch,
                "target_path": dec0.target.path,  # how the target runs: "torch bfloat16", ...
                "exact": dec0.target.exact,  # greedy output identical to plain decoding (--exact)
                # seconds to score M tokens in one call, as measured on this machine
                # (hardware/profile.py; {} where none was cached when the models loaded): what
                # bench-serve's bound reads
                "cost_curve": {str(m): s for m, s in sorted(decoders[0].estimates.costs.profile.items())}}
        if not scheduler.taking:  # a load balancer takes a draining server out of rotation
            return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
        return body

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
