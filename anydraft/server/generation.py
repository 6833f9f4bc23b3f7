"""A completion request's generations in the scheduler: its options checked (`options_of`; a
chat request's tools, tools.py `tool_use`), one job per completion (``n``) queued (`submit`),
and their events read (`next_event`) until the response ends (`end` stops those not finished)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, fields, replace

from fastapi import Request

from ..chat import chat_ids
from ..config import override
from ..errors import AnydraftError
from ..request import RequestOptions
from ..sampling import SamplingParams
from .errors import ApiError, ClientGone, user_error
from .gate import client_of
from .scheduler import Job, QueueFull, SchedulerClosed
from .state import ServerState
from .tools import ToolUse, tool_use

DISCONNECT_POLL = 0.25  # seconds between checks that the client is still there
OPENAI_SAMPLING = SamplingParams(temperature=1.0)  # what a request leaves out (OpenAI's defaults)


@dataclass(eq=False)
class Choices:
    """One request's jobs, one per completion (``n``), and the events they share."""

    jobs: list[Job]
    events: asyncio.Queue
    tools: ToolUse | None = None  # the tools a chat answer may call (read back when it ends)
    checked_at: float = 0.0  # loop time of the handler's last check that the client is there


class _Tagged:
    """A request's event queue as one of its jobs sees it: each event tagged with the job's
    choice index (the ``n`` completions of one request share one queue)."""

    def __init__(self, queue: asyncio.Queue, index: int):
        self.queue, self.index = queue, index

    def put_nowait(self, event: tuple) -> None:
        self.queue.put_nowait((self.index, *event))


def options_of(state: ServerState, req, chat: bool, tools: ToolUse | None = None) -> RequestOptions:
    """The `RequestOptions` of ``req`` (a chat or text completion request; ``tools``: its
    `tool_use`, whose grammar forces calls), or the `ApiError` naming what to fix."""
    config, window = state.config, state.context_window
    if req.model != config.model_id:
        raise ApiError(404, f"model {req.model!r} does not exist: this server serves "
                            f"{config.model_id!r} (see GET /v1/models)",
                       param="model", code="model_not_found")
    max_tokens = req.requested_max_tokens
    if max_tokens is not None and max_tokens > window:
        raise ApiError(400, f"max_tokens is {max_tokens} but the model's context window is "
                            f"{window} tokens: ask for fewer", param="max_tokens",
                       code="context_length_exceeded")
    most = state.scheduler.most_at_once
    if req.choices > most:
        raise ApiError(400, f"n is {req.choices}, but this server runs or queues at most {most} "
                            "completions of one request: ask for fewer", param="n",
                       code="invalid_value")
    if max_tokens is None:
        max_tokens = min(config.default_max_tokens if chat else 16, window)
    # schemas.py refuses a response_format beside calls forced by a grammar
    grammar = req.grammar if tools is None or tools.grammar is None else tools.grammar
    try:
        return RequestOptions(max_tokens, sampling_of(req, state.decoder.target.logits_width),
                              chat=chat, stop=req.stop_list, method=req.anydraft_method,
                              logprobs=req.top_alternatives, grammar=grammar,
                              special_in_content=config.allow_special_in_content)
    except AnydraftError as exc:
        raise user_error(exc) from None


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


async def submit(state: ServerState, request: Request, req, chat: bool) -> Choices:
    """Queue the generations of ``req`` (a chat or text completion request; ``n``, one job
    each) and wait for one to start; returns them (or raises ApiError)."""
    config, scheduler, metrics = state.config, state.scheduler, state.metrics
    tools = tool_use(req, state.tool_format) if chat else None
    options = options_of(state, req, chat, tools)
    prompt = [m.as_template_message() for m in req.messages] if chat else req.prompt_text
    prompt_param = "messages" if chat else "prompt"

    def starter(choice: RequestOptions):
        def start(decoder, rows, job: Job):  # what fails here is the request's fault
            if tools is None:
                generation = decoder.start_request(prompt, choice, rows=rows, cancel=job.stop_reason)
            else:  # the tools rendered by the chat template, with the worker's own tokenizer
                ids = chat_ids(decoder.target.tokenizer, prompt, choice.special_in_content, tools.tools)
                generation = decoder.start_ids(decoder.check_ids(ids), choice, rows=rows,
                                               cancel=job.stop_reason)
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
    choices = Choices([Job(starter(replace(options, sampling=options.sampling.for_choice(i))),
                           loop, client=client, deadline=deadline, events=_Tagged(events, i))
                       for i in range(req.choices)], events, tools)
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
        raise user_error(exc) from None
    # the choices start alike (one prompt, one set of settings): the first to start or
    # fail tells whether the request was good
    try:
        index, kind, payload = await next_event(request, choices, deadline)
        if kind == "error":
            raise user_error(payload, prompt_param)
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


async def next_event(request: Request, choices: Choices, deadline: float | None = None):
    """The next ``(choice index, kind, payload)`` of the request's jobs; raises `ClientGone`
    once the client has disconnected (checked at least every `DISCONNECT_POLL` s, whether or
    not events keep coming), and `TimeoutError` once the perf_counter time ``deadline`` has
    passed."""
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


def end(state: ServerState, choices: Choices, finished: list, failed: int | None = None) -> None:
    """The response ended before every choice finished (``failed``: the one that failed, if
    one did): stop the others and count them."""
    for i, job in enumerate(choices.jobs):
        if not finished[i]:
            state.scheduler.cancel(job)
            state.metrics.generations.labels("error" if i == failed else "cancelled").inc()
