"""A request's body: JSON only, parsed and validated here (not by FastAPI), so that invalid
UTF-8, invalid JSON, oversize or slow bodies and type errors all get the same error shape
(errors.py). JSON is what every OpenAI client sends; a web page can POST text/plain or form
bodies to a local server without a CORS preflight, so nothing else is taken."""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from .errors import ApiError, ClientGone

log = logging.getLogger("anydraft.server")


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
    """The body of ``request`` as a ``model_cls`` (schemas.py), received within ``timeout``
    seconds and ``max_bytes``; else an `ApiError` saying what to fix (`ClientGone` if the
    client left while sending it)."""
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
