"""OpenAI tool calling (issue 63): a chat request's ``tools`` rendered by the model's own chat
template, ``tool_choice`` "required" or a named function enforced by a grammar, and the answer
read back into ``tool_calls``.

Two shapes of call, the catalog's families (`ToolFormat`), both read from any model's answer:

- "hermes" (Qwen2.5, Hermes; the template mentions ``<tool_call>``): any text, then one or more
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, blank between them (the
  last may go unclosed: the model ended it with its end of turn);
- "json" (Llama 3.1/3.2's custom tools): the whole answer is ``{"name": ..., "parameters": {...}}``
  (several separated by ``;`` are taken too). Small Qwen models write this shape too, without
  the tags (qwen2.5-coder-0.5b does with "auto").

"auto" is free text, read as it comes; "none" renders no tools and reads nothing; "required"
and a named function constrain the answer to calls (`ToolUse.grammar`), so their arguments
always parse and validate.

One reader (`ToolStream`) reads a streamed answer and a whole one alike (`answer_of` feeds it
the whole text), so both answers of one generation agree: the same content, the same calls,
the same ``arguments`` strings, the same finish reason. It streams as OpenAI does:

- text is content until a call begins (a ``<tool_call>``, or an answer that opens with ``{``);
- a call's head, ``{"name": "f", "arguments": `` (or ``"parameters"``; "name" first, as the
  templates write it), is held until it is whole. Only a head naming one of the request's
  tools, its arguments an object (or JSON text in a string), is a call: then its first chunk
  goes out (index, id, type, name, arguments ""), then each new piece of the arguments' JSON
  text as it is generated, the text as the model wrote it, up to the ``}`` that closes the
  object (JSON nesting followed through strings and escapes); the outer ``}`` and
  ``</tool_call>`` are not arguments. Arguments written as a JSON string go out decoded, whole,
  when the string ends; a call written without arguments, ``{"name": "f"}``, gets ``{}``.
  Parallel calls are indexed 0, 1, ...

What was sent stays sent; what does not read as calls is decided as soon as it shows:

- a first call that is not one (unknown name, another shape): nothing of it was sent, so the
  answer is text, all of it content, its finish reason the plain one;
- after a call was sent, text that is not a further call (text after the calls, a later call
  of no tool, a call's object not closed by its ``}``, a tagged call followed by anything but
  ``</tool_call>``) goes out as content, and the finish reason is the plain one ("stop"), not
  "tool_calls";
- arguments that are not a JSON object (malformed JSON, a string that is no object) were
  sent as written; the finish reason is then "stop" too;
- an answer cut short (max_tokens, the context, the timeout) keeps the calls it sent, the last
  one's arguments maybe unfinished, with the finish reason "length", as OpenAI answers.

So "tool_calls" says: the answer ended by itself, as calls of the request's tools, each one's
arguments a JSON object. The non-streamed answer gives the same calls and the content around
them (stripped, None when blank).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..constraints.grammar import JSON_LAYOUT, Grammar
from ..errors import AnydraftError
from .errors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a call with it (a special token: rarely seen as text)
# OpenAI's rule for function names
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
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

    def stream(self) -> ToolStream:
        """A reader of one answer (its calls streamed as they are generated, module docstring)."""
        return ToolStream(self.names)


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
    payload = "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})
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
    """``text``, an answer that ended by itself, as (the text before the calls, OpenAI
    ``tool_calls``) when it reads as calls of ``names`` throughout (its finish reason would be
    "tool_calls"); else None."""
    stream = ToolStream(names)
    stream.feed(text)
    _, called = stream.finish(natural_end=True)
    return (stream.content, stream.calls) if called else None


def answer_of(use: ToolUse | None, text: str, natural_end: bool) -> tuple[dict, bool]:
    """A finished choice's ``message`` fields (``content``, and ``tool_calls`` when a call was
    read) and whether its finish reason is "tool_calls": what the stream of the same text
    sends, put together (module docstring)."""
    if use is None:
        return {"content": text}, False
    stream = use.stream()
    stream.feed(text)
    _, called = stream.finish(natural_end)
    if not stream.calls:
        return {"content": stream.content}, False  # the whole text
    return {"content": stream.content.strip() or None, "tool_calls": stream.calls}, called


WHITESPACE = " \t\n\r"  # JSON's
ARGUMENTS_KEYS = ('"arguments"', '"parameters"')


class ToolStream:
    """One answer's text read as content and calls while it is generated (module docstring):
    `feed` each piece and send the deltas it returns, then `finish`. Each delta is a chunk's
    ``delta``: ``{"content": str}`` or ``{"tool_calls": [one call's chunk]}``. ``content`` and
    ``calls`` (OpenAI ``tool_calls``) hold what all of them sent.

    Invariant: ``text[:at]`` is decided (sent, or dropped as the calls' syntax); what follows is
    held, no more of it than the mode (`_read`) needs to decide."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.text, self.at, self.mode = "", 0, "start"
        self.content, self.calls, self.clean = "", [], True
        self.tagged = False  # the calls are in <tool_call> tags (else bare JSON)
        self.head = 0  # "head": where the call's JSON object begins
        # "arguments": written as a JSON string (else an object); the next character to scan,
        # and the JSON nesting before it
        self.as_string, self.scan, self.depth, self.in_string, self.escaped = False, 0, 0, False, False

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        out: list[dict] = []
        self._read(out, final=False)
        return out

    def finish(self, natural_end: bool) -> tuple[list[dict], bool]:
        """The last deltas (what was held, where it is no call), and whether the answer
        ends as "tool_calls": by itself, nothing but whole calls from the first on."""
        out: list[dict] = []
        self._read(out, final=True)
        return out, natural_end and bool(self.calls) and self.clean

    def _read(self, out: list[dict], final: bool) -> None:
        """Step through the modes while one decides something; ``final``: the text is all
        there is, nothing is held for later."""
        while getattr(self, "_" + self.mode)(out, final):
            pass

    # each mode reads ``text[at:]``: True when it moved on (another mode may read next)
    def _start(self, out, final) -> bool:
        """Nothing decided yet: an answer that opens with ``{`` (after blanks and Llama's tag)
        is bare JSON calls; any other is text."""
        rest = self.text[self.at:].lstrip()
        body = rest.removeprefix(PYTHON_TAG).lstrip()
        if not final and (not body or PYTHON_TAG.startswith(rest)):
            return False  # blank so far, or the tag begun
        if body.startswith("{"):
            self.mode, self.head = "head", len(self.text) - len(body)
        else:
            self.mode = "text"
        return True

    def _text(self, out, final) -> bool:
        """Content until a ``<tool_call>`` (a piece may end in the marker's first characters)."""
        rest = self.text[self.at:]
        start = rest.find(OPEN)
        if start >= 0:
            self._say(out, rest[:start])
            self.tagged, self.mode, self.head = True, "head", self.at + len(OPEN)
            return True
        self._say(out, rest[:len(rest) - (0 if final else _partial_end(rest, OPEN))])
        return False

    def _head(self, out, final) -> bool:
        """A call's head, held whole: a call of one of the tools, or text from ``at`` on."""
        head = _read_head(self.text, self.head, self.names)
        if head is None and not final:
            return False
        if head is None or head[0] is None:  # not a call: the rest of the answer is text
            self.clean, self.mode = False, "content"
            return True
        name, at = head
        index = len(self.calls)
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": name, "arguments": ""}}
        self.calls.append(call)
        out.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        if self.text[at] == "}":  # {"name": "f"}: no arguments
            self._arguments_piece(out, "{}")
            self.at, self.mode = at + 1, "tag_end" if self.tagged else "between"
        else:
            self.at, self.mode, self.as_string = at, "arguments", self.text[at] == '"'
            self.scan, self.depth, self.in_string, self.escaped = at, 0, False, False
        return True

    def _arguments(self, out, final) -> bool:
        """The arguments' JSON text sent as it comes, up to where its value ends."""
        end = self._value_end()
        if end is None:
            if not self.as_string:
                self._arguments_piece(out, self.text[self.at:])
                self.at = len(self.text)
            if final:
                self.clean = False  # unfinished
            return False
        if self.as_string:  # JSON text in a string: sent decoded, whole
            decoded = _json(self.text[self.at:end])
            if isinstance(decoded, str):
                self._arguments_piece(out, decoded)
        else:
            self._arguments_piece(out, self.text[self.at:end])
        self.clean = self.clean and isinstance(_json(self.calls[-1]["function"]["arguments"]), dict)
        self.at, self.mode = end, "object_end"
        return True

    def _object_end(self, out, final) -> bool:
        """The ``}`` that closes the call's object."""
        rest = self.text[self.at:].lstrip(WHITESPACE)
        if rest.startswith("}"):
            self.at = len(self.text) - len(rest) + 1
            self.mode = "tag_end" if self.tagged else "between"
            return True
        return self._not_calls(rest, "}", final, may_end=False)

    def _tag_end(self, out, final) -> bool:
        """The ``</tool_call>`` that closes a tagged call (or the end of the answer)."""
        rest = self.text[self.at:].lstrip(WHITESPACE)
        if rest.startswith(CLOSE):
            self.at, self.mode = len(self.text) - len(rest) + len(CLOSE), "between"
            return True
        return self._not_calls(rest, CLOSE, final, may_end=True)

    def _between(self, out, final) -> bool:
        """After a call: the next call (tagged, or bare after blanks or ``;``), or the end."""
        rest = self.text[self.at:].lstrip(WHITESPACE + ("" if self.tagged else ";"))
        opener = OPEN if self.tagged else "{"
        if rest.startswith(opener):
            self.at = len(self.text) - len(rest)
            self.mode, self.head = "head", self.at + (len(OPEN) if self.tagged else 0)
            return True
        return self._not_calls(rest, opener, final, may_end=True)

    def _not_calls(self, rest: str, expected: str, final: bool, may_end: bool) -> bool:
        """``rest`` (after blanks) should go on as ``expected`` or, where ``may_end``, end
        there: wait while it may still, else it is no call, and the rest of the answer is
        content."""
        if not rest and final:
            self.clean = self.clean and may_end
            return False
        if not final and expected.startswith(rest):
            return False
        self.clean, self.mode = False, "content"
        return True

    def _content(self, out, final) -> bool:
        """Content to the end: what is not calls."""
        self._say(out, self.text[self.at:])
        return False

    def _value_end(self) -> int | None:
        """Where the JSON value at ``at`` (an object or a string) ends, past its last character;
        None while it goes on. Follows nesting through strings and escapes, from ``scan`` on."""
        for i in range(self.scan, len(self.text)):
            c = self.text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
            if self.depth == 0 and not self.in_string:
                self.scan = i + 1
                return i + 1
        self.scan = len(self.text)
        return None

    def _say(self, out: list[dict], text: str) -> None:
        self.at += len(text)
        if not text:
            return
        self.content += text
        if out and "content" in out[-1]:
            out[-1]["content"] += text
        else:
            out.append({"content": text})

    def _arguments_piece(self, out: list[dict], text: str) -> None:
        if not text:
            return
        index = len(self.calls) - 1
        self.calls[-1]["function"]["arguments"] += text
        last = out[-1]["tool_calls"][0] if out and "tool_calls" in out[-1] else None
        if last is not None and last["index"] == index and "id" not in last:
            last["function"]["arguments"] += text
        else:
            out.append({"tool_calls": [{"index": index, "function": {"arguments": text}}]})


def _read_head(text: str, at: int, names: frozenset[str]) -> tuple | None:
    """The head of a call at ``text[at:]``, ``{"name": "<name>", "arguments": `` (or
    "parameters") then an object or a string, or ``{"name": "<name>"}``: (name, where its
    arguments begin, or its ``}`` when it has none); (None, None) when it is not one of
    ``names``' or not in this shape; None while it may still become one."""
    steps = (("{",), ('"name"',), (":",), tuple(f'"{n}"' for n in sorted(names)), (",", "}"),
             ARGUMENTS_KEYS, (":",), ("{", '"'))
    name = None
    for step, options in enumerate(steps):
        rest = text[at:].lstrip(WHITESPACE)
        at = len(text) - len(rest)
        token = next((o for o in options if rest.startswith(o)), None)
        if token is None:
            return None if any(o.startswith(rest) for o in options) else (None, None)
        if step == 3:
            name = token[1:-1]
        if token == "}" or step == len(steps) - 1:
            return name, at  # the token itself is the arguments' (or the object's end)
        at += len(token)
    raise AssertionError("unreachable")


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _partial_end(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (and is shorter)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
