"""OpenAI tool calling (issue 63): a chat request's ``tools`` rendered by the model's own chat
template, ``tool_choice`` "required" or a named function enforced by a grammar, and the answer
read back into ``tool_calls``.

Two shapes of call, the catalog's families (`ToolFormat`), both read from any model's answer:

- "hermes" (Qwen2.5, Hermes; the template mentions ``<tool_call>``): any text, then one or more
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, blank between them;
- "json" (Llama 3.1/3.2's custom tools): the whole answer is ``{"name": ..., "parameters": {...}}``
  (several separated by ``;`` are taken too). Small Qwen models write this shape too, without
  the tags (qwen2.5-coder-0.5b does with "auto").

An answer that does not read as calls of the request's tools (malformed JSON, an unknown name,
text after the calls, cut short by max_tokens) stays text: its finish reason is the plain one.
"auto" is free text, read after; "none" renders no tools and reads nothing; "required" and a
named function constrain the answer to calls (`ToolUse.grammar`), so their arguments always
parse and validate.

Streaming (`ToolStream`): text streams as content until the answer may become a call (a
``<tool_call>`` begins, or the answer opens with ``{``); from there it is held to the end
and sent as ``delta.tool_calls`` chunks (each call's id and name, then its arguments whole), or
as content if it does not read as calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..constraints.grammar import Grammar
from ..errors import AnydraftError
from .errors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a call with it (a special token: rarely seen as text)
# OpenAI's rule for function names
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# a call's JSON laid out as the templates write earlier calls (``tojson``: ", " and ": "), so
# the constrained answer looks like what the model saw; no free whitespace (a small model
# can spend its budget on it)
CALL_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolFormat:
    """How a model's chat template takes tools: the shape of its calls (``style``: "hermes" or
    "json"), the key of the arguments, and, for "hermes", the ``<tool_call>`` wrapper as a Lark
    grammar spells it (a token of the vocabulary of its own is named ``<tool_call>``, text is
    quoted)."""

    style: str
    arguments_key: str
    open: str = ""
    close: str = ""

    @classmethod
    def of(cls, tokenizer) -> ToolFormat | None:
        """The format of ``tokenizer``'s chat template; None when the template has no tools.
        Read once, at start-up (`ServerState.build`): the event loop never touches a worker's
        tokenizer."""
        template = getattr(tokenizer, "chat_template", None)
        source = json.dumps(template) if isinstance(template, dict) else str(template or "")
        if "tools" not in source:
            return None
        if OPEN not in source:
            return cls("json", "parameters")
        added = {t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()}

        def lark(marker: str) -> str:
            return marker if marker in added else json.dumps(marker)
        return cls("hermes", "arguments", lark(OPEN), lark(CLOSE))


def check_tools(tools: list[dict]) -> None:
    """Raise ValueError naming the tool whose name or parameters schema is bad (OpenAI's
    ``tools``: ``{"type": "function", "function": {"name", "description", "parameters"}}``)."""
    from llguidance import LLMatcher

    seen = set()
    for i, tool in enumerate(tools):
        function = tool["function"]
        name = function["name"]
        if not NAME.fullmatch(name):
            raise ValueError(f"tools: tools[{i}]'s name {name!r} must be 1 to 64 letters, digits, "
                             "underscores or dashes")
        if name in seen:
            raise ValueError(f"tools: two tools are named {name!r}")
        seen.add(name)
        parameters = function.get("parameters")
        if parameters is None:
            continue
        try:
            error = LLMatcher.validate_grammar(Grammar("json_schema", parameters).llguidance())
        except (AnydraftError, ValueError, RuntimeError) as exc:
            error = str(exc)
        if error:
            raise ValueError(f"tools: the parameters of tool {name!r} are not a usable JSON schema: "
                             f"{error.strip().splitlines()[-1]}")


@dataclass(frozen=True)
class ToolUse:
    """A request's tools: as its chat template renders them (``tools``, OpenAI's shape), the
    names a call may take, the call shape, and the grammar that forces calls (None: "auto")."""

    tools: list[dict]
    names: frozenset[str]
    format: ToolFormat
    grammar: Grammar | None

    def parse(self, text: str) -> tuple[str, list[dict]] | None:
        """``text``, a finished answer, as (the text before the calls, the calls as OpenAI's
        ``tool_calls``); None when it does not read as calls of these tools."""
        return parse_calls(text, self.names)

    def stream(self) -> ToolStream:
        return ToolStream(self)


def tool_use(req, fmt: ToolFormat | None) -> ToolUse | None:
    """The tools of ``req`` (a chat request) on a model whose template has format ``fmt``; None
    when no tool is offered or ``tool_choice`` is "none" (nothing rendered, nothing read)."""
    if not req.tools or req.tool_choice == "none":
        return None
    if fmt is None:
        raise ApiError(400, "tools: this model's chat template has no tools (it does not render "
                            "them): serve a model whose template takes tools, or leave tools out",
                       param="tools", code="tools_unsupported")
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    names = frozenset(t["function"]["name"] for t in tools)
    choice = req.tool_choice_name
    if choice == "auto":
        return ToolUse(tools, names, fmt, None)
    if choice == "required":
        forced, many = tools, req.parallel_tool_calls is not False
    else:  # a named function (schemas.py checked that it is one of the tools)
        forced, many = [t for t in tools if t["function"]["name"] == choice], False
    return ToolUse(tools, names, fmt, call_grammar(fmt, forced, many))


def call_grammar(fmt: ToolFormat, tools: list[dict], many: bool) -> Grammar:
    """A Lark grammar of calls of ``tools`` in ``fmt``'s shape, their arguments matching each
    tool's parameters schema (``many``: one or more calls, "hermes" only, as Llama 3's
    templates take one call a turn; else exactly one)."""
    key = fmt.arguments_key

    def shape(tool: dict, at: str) -> dict:
        # the parameters schema now sits at ``at``: its own references ("#/$defs/...") follow it
        parameters = _moved(tool["function"].get("parameters", NO_PARAMETERS), f"{at}/properties/{key}")
        return {"type": "object", "properties": {"name": {"const": tool["function"]["name"]}, key: parameters},
                "required": ["name", key], "additionalProperties": False}
    schema = (shape(tools[0], "#") if len(tools) == 1
              else {"anyOf": [shape(t, f"#/anyOf/{i}") for i, t in enumerate(tools)]})
    payload = "%json " + json.dumps({**schema, "x-guidance": CALL_LAYOUT})
    if fmt.style == "json":
        return Grammar("lark", f"start: {payload}")
    return Grammar("lark", "\n".join([
        'start: call ("\\n" call)*' if many else "start: call",
        f'call: {fmt.open} "\\n" payload "\\n" {fmt.close}',
        f"payload: {payload}"]))


def _moved(schema, root: str):
    """``schema`` with its local references (``$ref`` "#...") rebased on ``root``, the JSON
    pointer where it is placed inside a larger schema."""
    if isinstance(schema, dict):
        return {k: root + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else _moved(v, root) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_moved(v, root) for v in schema]
    return schema


def parse_calls(text: str, names: frozenset[str]) -> tuple[str, list[dict]] | None:
    """``text`` as (the text before the calls, OpenAI ``tool_calls``), ``<tool_call>`` blocks
    or bare JSON (module docstring); None when it is not calls of ``names``."""
    start = text.find(OPEN)
    if start >= 0:
        before, rest, calls = text[:start], text[start:], []
        while rest.strip():
            rest = rest.lstrip()
            if not rest.startswith(OPEN):
                return None  # text after a call
            # the last call may go unclosed: the model ended it with its end of turn
            body, _, rest = rest[len(OPEN):].partition(CLOSE)
            call = _call(_json(body), names)
            if call is None:
                return None
            calls.append(call)
        return before, calls
    head = text.strip().removeprefix(PYTHON_TAG).lstrip()
    if not head.startswith("{"):
        return None
    decoder, at, calls = json.JSONDecoder(), 0, []
    while at < len(head):
        try:
            obj, at = decoder.raw_decode(head, at)
        except ValueError:
            return None
        call = _call(obj, names)
        if call is None:
            return None
        calls.append(call)
        while at < len(head) and (head[at].isspace() or head[at] == ";"):
            at += 1
    return "", calls


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(obj, names: frozenset[str]) -> dict | None:
    """One call in OpenAI's shape, a fresh id; None unless ``obj`` calls one of ``names``
    with an object of arguments (under "arguments" or "parameters")."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def answer_of(use: ToolUse | None, text: str, natural_end: bool) -> tuple[dict, bool]:
    """A finished choice's ``message`` fields (``content``, and ``tool_calls`` when it called
    tools) and whether it did. Only an answer that ended by itself (not cut short) is read."""
    parsed = use.parse(text) if use is not None and natural_end else None
    if parsed is None:
        return {"content": text}, False
    before, calls = parsed
    return {"content": before.strip() or None, "tool_calls": calls}, True


class ToolStream:
    """One streamed choice's text: `feed` each piece, send what it returns as content now;
    `finish` gives the rest of the content and the calls (module docstring)."""

    def __init__(self, use: ToolUse):
        self.use, self.text, self.sent, self.held = use, "", 0, False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.held:
            return ""
        pending = self.text[self.sent:]
        head = self.text.lstrip()
        if not self.sent and (not head or PYTHON_TAG.startswith(head)):
            return ""  # undecided: blank so far, or the tag begun
        if not self.sent and head.removeprefix(PYTHON_TAG).lstrip()[:1] in ("{", ""):
            self.held = True  # the whole answer may be JSON calls
            return ""
        start = pending.find(OPEN)
        if start >= 0:
            self.held, out = True, pending[:start]
        else:  # a piece may end in the first characters of the marker
            out = pending[:len(pending) - _partial_end(pending, OPEN)]
        self.sent += len(out)
        return out

    def finish(self, natural_end: bool) -> tuple[str, list[dict] | None]:
        """(content not sent yet, the calls or None); the whole text when it is not calls."""
        parsed = self.use.parse(self.text) if natural_end else None
        if parsed is None:
            return self.text[self.sent:], None
        before, calls = parsed
        rest = before[self.sent:]
        return (rest if rest.strip() else ""), calls


def _partial_end(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (and is shorter)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_deltas(calls: list[dict]) -> list[list[dict]]:
    """``calls`` as the ``delta.tool_calls`` of successive chunks, as OpenAI streams them: each
    call's index, id, type and name with empty arguments, then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        function = call["function"]
        deltas.append([{"index": index, "id": call["id"], "type": "function",
                        "function": {"name": function["name"], "arguments": ""}}])
        deltas.append([{"index": index, "function": {"arguments": function["arguments"]}}])
    return deltas
