"""FastAPI app: the OpenAI routes over a `Scheduler` of decoders, with OpenAI-style errors.

Every failure a client can cause is an `ApiError` -> ``{"error": {message, type, param, code}}``
with a 4xx status; bodies are parsed here (not by FastAPI) so that invalid UTF-8, invalid
JSON, oversize bodies and type errors all get the same error shape.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import override
from ..errors import AnydraftError
from ..sampling import SamplingParams
from .metrics import Metrics
from .scheduler import Job, QueueFull, Scheduler, SchedulerClosed
from .schemas import ChatCompletionRequest, CompletionRequest

log = logging.getLogger("anydraft.server")

# anydraft finish reasons -> OpenAI's ("context": the window filled up before max_tokens)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
DISCONNECT_POLL = 0.25  # seconds between checks that the client is still there
ENDPOINTS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"}
OPENAI_SAMPLING = SamplingParams(temperature=1.0)  # what a request leaves out (OpenAI's defaults)


@dataclass
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_queue: int = 64
    max_body_bytes: int = 2 * 2**20
    default_max_tokens: int = 256  # chat; completions default to OpenAI's 16
    owned_by: str = "anydraft"


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


async def parse_body(request: Request, model_cls, max_bytes: int):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ApiError(413, f"request body is {length} bytes; the limit is {max_bytes}",
                       code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes",
                           code="request_too_large")
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


def sampling_of(req) -> SamplingParams:
    """The request's sampling settings, validated by `SamplingParams` (400 naming the field)."""
    try:
        return override(OPENAI_SAMPLING, **req.sampling_fields)
    except AnydraftError as exc:  # "invalid sampling settings: top_p must be ..."
        field = str(exc).partition(": ")[2].split(" ", 1)[0]
        param = field if field in {f.name for f in fields(SamplingParams)} else None
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


def _user_error(exc: BaseException, prompt_param: str | None = None) -> ApiError:
    """An exception from a generation job, as the error the client sees."""
    if isinstance(exc, ApiError):
        return exc
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
    log.error("generation failed", exc_info=exc)
    return ApiError(500, f"internal error during generation ({type(exc).__name__})",
                    type="server_error", code="internal_error")


class Gate:
    """ASGI middleware: bearer auth (except /health) and per-endpoint request metrics."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics):
        self.app, self.config, self.metrics = app, config, metrics
        self._key = config.api_key.encode() if config.api_key else None

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
            await send(message)

        try:
            if self._key is not None and path != "/health" and not self._authorized(scope):
                err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
                self.metrics.errors.labels(err.type, err.code).inc()
                await JSONResponse(err.body(), status_code=401,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, send_tracked)
            else:
                await self.app(scope, receive, send_tracked)
        except Exception:
            status[0] = status[0] or 500
            raise
        finally:
            self.metrics.requests.labels(endpoint, str(status[0] or 499)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)


def create_app(decoders: list, config: ServerConfig) -> FastAPI:
    """The app serving ``decoders`` (one worker thread each; they should share one model)."""
    scheduler = Scheduler(decoders, config.max_queue)
    metrics = Metrics(scheduler)
    dec0 = decoders[0]
    ctx = dec0.target.context_window
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="anydraft", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.scheduler, app.state.metrics, app.state.config = scheduler, metrics, config

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

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        log.error("unhandled error", exc_info=exc)
        return error_response(ApiError(500, f"internal error ({type(exc).__name__})",
                                       type="server_error", code="internal_error"))

    app.add_middleware(Gate, config=config, metrics=metrics)

    # -- helpers ---------------------------------------------------------------------------
    async def next_event(request: Request, job: Job):
        """The job's next event; raises `ClientGone` once the client has disconnected
        (checked at least every `DISCONNECT_POLL` s, whether or not events keep coming)."""
        loop = asyncio.get_running_loop()
        while True:
            if loop.time() - job.checked_at >= DISCONNECT_POLL:
                job.checked_at = loop.time()
                if await request.is_disconnected():
                    raise ClientGone()
            try:
                return await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL)
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
        return max_tokens

    async def run(request: Request, req, chat: bool):
        """Queue the generation and wait for it to start; returns the job (or raises ApiError)."""
        max_tokens = check_request(req)
        if max_tokens is None:
            max_tokens = min(config.default_max_tokens if chat else 16, ctx)
        prompt = [m.as_template_message() for m in req.messages] if chat else req.prompt_text
        kwargs = dict(max_new_tokens=max_tokens, sampling=sampling_of(req), chat=chat,
                      stop=req.stop_list)

        def work(decoder, job: Job):
            try:
                stream = decoder.stream(prompt, **kwargs)  # validates eagerly
            except Exception as exc:  # noqa: BLE001 - reported to the client as 4xx/5xx
                job.emit("error", exc)
                return
            job.emit("started")
            deltas = iter(stream)
            try:
                for delta in deltas:
                    if job.cancelled.is_set():
                        job.emit("cancelled")
                        return
                    job.emit("delta", delta)
            finally:
                deltas.close()
            job.emit("done", stream.output)

        client = request.client.host if request.client else "-"
        job = Job(work, asyncio.get_running_loop(), client=client)
        try:
            scheduler.submit(job)
        except QueueFull as exc:
            raise ApiError(429, f"{exc}: the queue is full ({config.max_queue} waiting)",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after)}) from None
        except SchedulerClosed as exc:
            raise _user_error(exc) from None
        try:
            kind, payload = await next_event(request, job)
        except BaseException as exc:
            scheduler.cancel(job)
            if isinstance(exc, ClientGone):  # gave up while queued or starting
                metrics.generations.labels("cancelled").inc()
            raise
        if kind == "error":
            raise _user_error(payload, "messages" if chat else "prompt")
        assert kind == "started", kind
        metrics.queue_wait.observe((job.started_at or time.perf_counter()) - job.enqueued_at)
        return job

    def finish(request: Request, out) -> tuple[str, dict, dict]:
        stats = dict(out.stats)
        reason = FINISH_REASONS.get(out.finish_reason, out.finish_reason)
        metrics.record_generation(stats, out.finish_reason)
        stats["finish_reason"] = out.finish_reason
        usage = {"prompt_tokens": stats.get("prompt_tokens", 0),
                 "completion_tokens": stats.get("new_tokens", len(out.token_ids)),
                 "total_tokens": stats.get("prompt_tokens", 0) + stats.get("new_tokens", 0)}
        return reason, usage, stats

    def first_token(request: Request):
        arrived = request.scope.get("state", {}).get("arrived")
        if arrived is not None:
            metrics.ttft.observe(time.perf_counter() - arrived)

    async def complete(request: Request, req, chat: bool):
        job = await run(request, req, chat)
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        now = int(time.time())
        if req.stream:
            return StreamingResponse(
                sse(request, req, job, chat, cid, now), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts, done, failed = [], False, False
        try:
            while True:
                kind, payload = await next_event(request, job)
                if kind == "delta":
                    if not parts:
                        first_token(request)
                    parts.append(payload)
                elif kind == "done":
                    done = True
                    break
                elif kind == "cancelled":
                    raise ClientGone()
                else:
                    failed = True
                    raise _user_error(payload)
        finally:
            if not done:
                scheduler.cancel(job)
                metrics.generations.labels("error" if failed else "cancelled").inc()
        reason, usage, stats = finish(request, payload)
        text = "".join(parts)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {"id": cid, "object": "chat.completion" if chat else "text_completion",
                "created": now, "model": config.model_id, "system_fingerprint": None,
                "choices": [choice], "usage": usage, "anydraft": stats}

    async def sse(request: Request, req, job: Job, chat: bool, cid: str, now: int):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece: str | None, reason=None, **extra) -> str:
            if chat:
                delta = {} if piece is None else {"content": piece}
                if extra.pop("role", False):
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": reason}
            body = {"id": cid, "object": obj, "created": now, "model": config.model_id,
                    "system_fingerprint": None, "choices": [choice], **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        done, first = False, True
        try:
            if chat:
                yield chunk("", role=True)
            while True:
                kind, payload = await next_event(request, job)
                if kind == "delta":
                    if first:
                        first_token(request)
                        first = False
                    yield chunk(payload)
                elif kind == "done":
                    done = True
                    reason, usage, stats = finish(request, payload)
                    extra = {"anydraft": stats}
                    if not req.include_usage:  # the chunk the client sees last carries usage
                        extra["usage"] = usage
                    yield chunk(None, reason, **extra)
                    if req.include_usage:
                        body = {"id": cid, "object": obj, "created": now, "model": config.model_id,
                                "choices": [], "usage": usage}
                        yield f"data: {json.dumps(body)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                elif kind == "cancelled":
                    return
                else:
                    done = True
                    metrics.generations.labels("error").inc()
                    err = _user_error(payload)
                    metrics.errors.labels(err.type, err.code or "").inc()
                    yield f"data: {json.dumps(err.body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
        except ClientGone:
            return  # nobody to send to; the finally below frees the worker
        finally:
            if not done:
                scheduler.cancel(job)
                metrics.generations.labels("cancelled").inc()

    # -- routes ----------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse_body(request, ChatCompletionRequest, config.max_body_bytes)
        return await complete(request, req, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parse_body(request, CompletionRequest, config.max_body_bytes)
        return await complete(request, req, chat=False)

    @app.get("/v1/models")
    async def models():
        drafter = decoders[0].drafter
        return {"object": "list", "data": [{
            "id": config.model_id, "object": "model", "created": created,
            "owned_by": config.owned_by,
            "anydraft": {"target": dec0.target.name, "drafter": drafter.name if drafter else None,
                         "method": dec0.draft.method, "context_window": ctx, "workers": len(decoders)},
        }]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_id, "waiting": scheduler.waiting,
                "active": scheduler.active, "workers": len(decoders)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
