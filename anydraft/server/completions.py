"""``POST /v1/chat/completions`` and ``POST /v1/completions``: one flow for both (`complete`),
answered as one JSON body (`_body`) or as server-sent events (`_events`); a chat answer that
calls tools as ``tool_calls`` (tools.py)."""

from __future__ import annotations

import json
import time
import uuid

from fastapi import Request
from fastapi.responses import StreamingResponse

from .body import parse_body
from .errors import ClientGone, user_error
from .generation import Choices, end, next_event, submit
from .logprobs import logprobs_json
from .schemas import ChatCompletionRequest, CompletionRequest
from .state import ServerState, server_of
from .tools import answer_of

# anydraft finish reasons -> OpenAI's ("context": the window filled up before max_tokens;
# "timeout": --request-timeout passed; both are a cut-short answer, as "length" says)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
                  "timeout": "length"}
NATURAL_ENDS = ("eos", "stop")  # the answer ended by itself: only then may it end as "tool_calls"


async def chat_completions(request: Request):
    state = server_of(request)
    req = await parse_body(request, ChatCompletionRequest, state.config.max_body_bytes,
                           state.config.body_timeout)
    return await complete(state, request, req, chat=True)


async def completions(request: Request):
    state = server_of(request)
    req = await parse_body(request, CompletionRequest, state.config.max_body_bytes,
                           state.config.body_timeout)
    return await complete(state, request, req, chat=False)


async def complete(state: ServerState, request: Request, req, chat: bool):
    """The answer to ``req``, once one of its generations has started (until then, a failure
    is an error response)."""
    choices = await submit(state, request, req, chat)
    cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    now = int(time.time())
    if req.stream:
        return StreamingResponse(
            _events(state, request, req, choices, chat, cid, now), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _body(state, request, choices, chat, cid, now)


def _finish(state: ServerState, out) -> tuple[str, dict, dict]:
    """A finished choice's OpenAI finish reason, usage and anydraft statistics (recorded in
    the metrics)."""
    stats = dict(out.stats)
    reason = FINISH_REASONS.get(out.finish_reason, out.finish_reason)
    state.metrics.record_generation(stats, out.finish_reason)
    stats["finish_reason"] = out.finish_reason
    usage = {"prompt_tokens": stats.get("prompt_tokens", 0),
             "completion_tokens": stats.get("new_tokens", len(out.token_ids)),
             "cached_tokens": stats.get("cached_tokens", 0)}
    return reason, usage, stats


def _total_usage(usages: list[dict]) -> dict:
    """One request's usage: its prompt once, every choice's completion."""
    prompt = usages[0]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # OpenAI's: prompt tokens a cache held (models/prefix.py), the most of any choice's
            "prompt_tokens_details": {"cached_tokens": max(u["cached_tokens"] for u in usages)}}


def _first_token(state: ServerState, request: Request) -> None:
    arrived = request.scope.get("state", {}).get("arrived")
    if arrived is not None:
        state.metrics.ttft.observe(time.perf_counter() - arrived)


async def _body(state: ServerState, request: Request, choices: Choices, chat: bool, cid: str,
                now: int) -> dict:
    """The whole answer as one JSON body, once every choice has finished."""
    n = len(choices.jobs)
    parts, outputs, failed = [[] for _ in range(n)], [None] * n, None
    try:
        while None in outputs:
            index, kind, payload = await next_event(request, choices)
            if kind == "delta" and payload.text:
                if not any(parts):
                    _first_token(state, request)
                parts[index].append(payload.text)
            elif kind == "done":
                outputs[index] = payload
            elif kind == "cancelled":
                raise ClientGone()
            elif kind == "error":
                failed = index
                raise user_error(payload)
    finally:
        end(state, choices, outputs, failed)
    body, usages, all_stats = [], [], []
    for index, out in enumerate(outputs):
        reason, usage, stats = _finish(state, out)
        usages.append(usage)
        all_stats.append(stats)
        text = "".join(parts[index])
        logprobs = None if out.logprobs is None else logprobs_json(state.spellings, out.logprobs, chat)[0]
        if chat:
            message, called = answer_of(choices.tools, text, out.finish_reason in NATURAL_ENDS)
            body.append({"index": index, "message": {"role": "assistant", **message},
                         "logprobs": logprobs, "finish_reason": "tool_calls" if called else reason})
        else:
            body.append({"index": index, "text": text, "logprobs": logprobs,
                         "finish_reason": reason})
    return {"id": cid, "object": "chat.completion" if chat else "text_completion",
            "created": now, "model": state.config.model_id, "system_fingerprint": None,
            "choices": body, "usage": _total_usage(usages),
            "anydraft": all_stats[0] if n == 1 else {"choices": all_stats}}


async def _events(state: ServerState, request: Request, req, choices: Choices, chat: bool,
                  cid: str, now: int):
    """The answer as server-sent events: a chunk per piece of text of a choice, its last
    with the finish reason; an error event if a choice fails; then ``[DONE]``. A chat answer
    that may call tools is read as it comes (tools.py `ToolStream`): its text as content, its
    calls as ``delta.tool_calls`` chunks, each call's arguments piece by piece."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    model = state.config.model_id
    n = len(choices.jobs)
    offsets = [0] * n  # per choice: characters its tokens' logprobs spelt so far
    calls = [choices.tools.stream() if choices.tools else None for _ in range(n)]

    def chunk(index: int, piece: str | None, reason=None, tokens=(), tool_calls=None, **extra) -> str:
        logprobs = None
        if tokens:  # log-probabilities of the piece's tokens
            logprobs, offsets[index] = logprobs_json(state.spellings, tokens, chat, offsets[index])
        if chat:
            delta = {} if piece is None else {"content": piece}
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            if extra.pop("role", False):
                delta["role"] = "assistant"
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": index, "text": piece or "", "logprobs": logprobs,
                      "finish_reason": reason}
        body = {"id": cid, "object": obj, "created": now, "model": model,
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
            if kind == "delta":
                if payload.text and first:
                    _first_token(state, request)
                    first = False
                # a choice that may call tools: content, call chunks, or held (tools.py)
                piece = payload.text
                deltas = (calls[index].feed(piece) if calls[index] is not None
                          else [{"content": piece}] if piece else [])
                if piece and deltas == [{"content": piece}]:
                    spans = [{"text": text, "origin": origin} for text, origin in payload.spans]
                    yield chunk(index, piece, tokens=payload.logprobs,
                                anydraft={"spans": spans, "steps": payload.steps})
                    continue
                # a piece not shown whole as content: its origins and steps go with the last chunk
                for delta in deltas:
                    yield chunk(index, delta.get("content"), tool_calls=delta.get("tool_calls"))
                steps[index] += payload.steps
                tokens[index] += payload.logprobs
            elif kind == "done":
                reason, usages[index], stats = _finish(state, payload)
                if calls[index] is not None:  # what was held, then the reason (tools.py)
                    deltas, called = calls[index].finish(payload.finish_reason in NATURAL_ENDS)
                    for delta in deltas:
                        yield chunk(index, delta.get("content"), tool_calls=delta.get("tool_calls"))
                    reason = "tool_calls" if called else reason
                extra = {"anydraft": {**stats, "steps": steps[index]}}
                if None not in usages and not req.include_usage:
                    extra["usage"] = _total_usage(usages)  # on the chunk the client sees last
                yield chunk(index, None, reason, tokens=tokens[index], **extra)
            elif kind == "cancelled":
                return
            elif kind == "error":
                ended, failed = True, index
                err = user_error(payload)
                state.metrics.errors.labels(err.type, err.code or "").inc()
                yield f"data: {json.dumps(err.body())}\n\n"
                yield "data: [DONE]\n\n"
                return
        ended = True
        if req.include_usage:
            body = {"id": cid, "object": obj, "created": now, "model": model,
                    "choices": [], "usage": _total_usage(usages)}
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
    except ClientGone:
        return  # nobody to send to; the finally below frees the workers
    finally:
        if not ended:  # the client left (or the server is stopping): recorded as 499
            request.scope.setdefault("state", {})["client_gone"] = True
        end(state, choices, usages, failed)
