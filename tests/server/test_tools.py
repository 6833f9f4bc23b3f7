"""Tool calling through the server (issue 63): ``tools`` rendered by the model's chat template,
``tool_choice`` "required" and named functions forced by a grammar, answers read back into
``tool_calls`` (Hermes/Qwen ``<tool_call>`` and Llama-3 JSON), streamed as ``delta.tool_calls``.

The tiny random model's template has no tools (a 400); in-process servers give its tokenizer a
Hermes or a Llama-3 style template, where only the grammar makes its noise a valid call. The
parser and the stream are tested on text; the rendering on the catalog's Qwen tokenizer; one
real test drives a three-turn tool loop on qwen2.5-coder-0.5b with the official client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from anydraft.constraints.grammar import JSON_LAYOUT
from anydraft.server.tools import (
    ToolFormat,
    ToolStream,
    ToolUse,
    answer_of,
    call_grammar,
    check_tools,
    parse_calls,
)
from tests.conftest import require_llamacpp, require_model
from tests.server.conftest import MODEL_ID, chat_body
from tests.server_process import Server

CHAT = "/v1/chat/completions"
WEATHER = {"type": "object",
           "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
NAMES = frozenset(SCHEMAS)

# a Hermes-style template (Qwen2.5's shape, shortened) and a Llama-3.1-style one
HERMES = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools>\nCall one as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n"
    "</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{% for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA = (
    "{%- if tools %}<|im_start|>system\nRespond with {\"name\": function name, \"parameters\": "
    "dictionary of arguments}.{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", \"parameters\": "
    "{{ c.function.arguments | tojson }}}{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>ipython\n{{ m.content }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

HERMES_FORMAT = ToolFormat("hermes", "arguments", '"<tool_call>"', '"</tool_call>"')
JSON_FORMAT = ToolFormat("json", "parameters")


def _use(fmt=HERMES_FORMAT, grammar=None) -> ToolUse:
    return ToolUse(TOOLS, NAMES, fmt, grammar)


def _check_calls(calls: list) -> None:
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
    for call in calls:
        assert call["type"] == "function"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


# -- reading answers ---------------------------------------------------------------------------
def _fed(text: str, size: int = 1, natural_end: bool = True) -> tuple[str, list, bool, list]:
    """``text`` fed to a `ToolStream` ``size`` characters at a time, put together as a client
    does: (content, calls as (name, arguments), whether it ended as "tool_calls", per piece fed
    the deltas it gave, then those of the end)."""
    stream = ToolStream(NAMES)
    given = [stream.feed(text[i:i + size]) for i in range(0, len(text), size)]
    rest, called = stream.finish(natural_end)
    given.append(rest)
    content, calls = "", {}
    for delta in (d for deltas in given for d in deltas):
        assert len(delta) == 1  # content or one call's chunk: never both
        content += delta.get("content", "")
        for part in delta.get("tool_calls", ()):
            if "id" in part:  # a call's first chunk: index, id, type, name, arguments ""
                assert part["index"] == len(calls) and part["type"] == "function"
                assert part["function"]["arguments"] == ""
                calls[part["index"]] = [part["function"]["name"], ""]
            calls[part["index"]][1] += part["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], called, given


def _agrees(text: str, natural_end: bool = True) -> tuple[str, list, bool]:
    """What ``text`` reads as, streamed in pieces of any size and whole (`answer_of`), which
    must agree: (content, calls as (name, arguments), whether "tool_calls")."""
    first = _fed(text, 1, natural_end)[:3]
    for size in (2, 3, 7, len(text) or 1):
        assert _fed(text, size, natural_end)[:3] == first, size
    message, called = answer_of(_use(), text, natural_end)
    content, calls, streamed_called = first
    assert called == streamed_called
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", ())] == calls
    assert message["content"] == ((content.strip() or None) if calls else content)
    return first


def test_hermes_calls_one_or_several_with_text_before():
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c", "days": 2}}\n</tool_call>'
    before, calls = parse_calls(one, NAMES)
    assert before == "" and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert calls[0]["function"]["arguments"] == '{"unit": "c", "days": 2}'  # as the model wrote it
    two = ("Let me look.\n" + one + "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
           "{\"zone\": \"utc\"}}\n</tool_call>\n")
    before, calls = parse_calls(two, NAMES)
    assert before == "Let me look.\n" and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    _check_calls(calls)
    assert _agrees(two) == ("Let me look.\n", [("get_weather", '{"unit": "c", "days": 2}'),
                                                ("get_time", '{"zone": "utc"}')], True)
    # the last call may end with the turn instead of its closing tag; arguments as JSON text
    _, calls = parse_calls('<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"cet\\"}"}',
                           NAMES)
    assert calls[0]["function"]["arguments"] == '{"zone": "cet"}'
    # no arguments at all: {}; braces, quotes and escapes inside strings are not nesting
    tricky = '{"q": "a } b \\" {", "n": [1, {"x": "]}"}], "u": "\\u00e9\\\\"}'
    assert _agrees('<tool_call>{"name":"get_time"}</tool_call>\n<tool_call>\n{ "name" : "get_weather" ,'
                   ' "parameters":' + tricky + ' }\n</tool_call>') == (
        "", [("get_time", "{}"), ("get_weather", tricky)], True)


@pytest.mark.parametrize("text", [
    "just an answer",
    '<tool_call>\n{"name": "get_stock", "arguments": {}}\n</tool_call>',  # not a tool
    '<tool_call>\n{"name": "get_time", "arguments": [1]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{"arguments": {"zone": "utc"}, "name": "get_time"}\n</tool_call>',  # name not first
    '<tool_call>\n{"name": "get_time", "arg',  # the head unfinished
    '{"answer": 42}',
    'Sure: {"name": "get_time", "parameters": {"zone": "utc"}}',  # bare JSON only as the whole answer
    "Hi {there}",
    "a <tool> and <tool_c",
])
def test_what_is_no_call_from_its_start_stays_text(text):
    """Decided before anything of a call is sent: the whole answer is content."""
    assert parse_calls(text, NAMES) is None
    assert answer_of(_use(), text, natural_end=True) == ({"content": text}, False)
    assert _agrees(text) == (text, [], False)


@pytest.mark.parametrize("text,content,arguments", [
    # a call's object a brace short; text after the calls; a later call of no tool
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}\n</tool_call>',
     "\n</tool_call>", ['{"zone": "utc"}']),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> and then some text',
     " and then some text", ["{}"]),
    ('{"name": "get_time", "arguments": {"zone": "utc"}} and then some text',
     " and then some text", ['{"zone": "utc"}']),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_stock"}',
     '<tool_call>\n{"name": "get_stock"}', ["{}"]),
    # arguments that are no JSON object: sent as written
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": utc}}\n</tool_call>', "", ['{"zone": utc}']),
    ('<tool_call>\n{"name": "get_time", "arguments": "[1]"}\n</tool_call>', "", ["[1]"]),
    ('{"name": "get_weather", "parameters": {"unit": "f"', "", ['{"unit": "f"']),  # the end came first
])
def test_what_goes_wrong_after_a_call_was_sent(text, content, arguments):
    """What was sent stays sent, the rest of the answer is content, and the finish reason is
    the plain one: not "tool_calls"."""
    assert parse_calls(text, NAMES) is None
    content_, calls, called = _agrees(text)
    assert (content_, [a for _, a in calls], called) == (content, arguments, False)


def test_an_answer_cut_short_keeps_its_calls_without_tool_calls_reason():
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    message, called = answer_of(_use(), text, natural_end=True)
    assert called and message["content"] is None and len(message["tool_calls"]) == 1
    message, called = answer_of(_use(), text, natural_end=False)  # "length": OpenAI's answer too
    assert not called and message["content"] is None and len(message["tool_calls"]) == 1
    assert answer_of(None, text, natural_end=True) == ({"content": text}, False)  # tool_choice none
    cut = text[:text.index('"utc"') + 3]  # inside the arguments: what was sent so far
    assert _agrees(cut, natural_end=False) == ("", [("get_time", '{"zone": "ut')], False)
    cut = '<tool_call>\n{"name": "get_ti'  # before the name is known: text
    assert _agrees(cut, natural_end=False) == (cut, [], False)


def test_bare_json_calls_llama_and_small_qwens():
    text = '{"name": "get_weather", "parameters": {"unit": "f", "days": 7}}'
    before, calls = parse_calls(text, NAMES)
    assert before == "" and json.loads(calls[0]["function"]["arguments"]) == {"unit": "f", "days": 7}
    _, calls = parse_calls('<|python_tag|>' + text + '; {"name": "get_time", "parameters": {"zone": "utc"}}',
                           NAMES)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    _check_calls(calls)
    _, calls = parse_calls('  {"name": "get_time", "arguments": {"zone": "utc"}}\n', NAMES)  # Qwen's keys
    assert json.loads(calls[0]["function"]["arguments"]) == {"zone": "utc"}
    for bad in ('{"name": "get_weather", "parameters": {"unit": "f"', "The weather is fine.",
                '{"answer": 42}', text + " thanks", "Sure: " + text):
        assert parse_calls(bad, NAMES) is None, bad


def test_the_stream_sends_a_call_once_its_name_is_known_and_its_arguments_as_they_come():
    """One character at a time: the call's first chunk goes out with the ``{`` that opens its
    arguments, each later character of the arguments at once, nothing of the call's syntax."""
    head = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": '
    arguments = '{"zone": "utc", "note": "} \\" {"}'
    text = (head + arguments + '}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"unit": "c", "days": 1}}\n</tool_call>')
    content, calls, called, given = _fed(text)
    assert (content, called) == ("Checking.\n", True)
    assert calls == [("get_time", arguments), ("get_weather", '{"unit": "c", "days": 1}')]
    at = len(head)  # the piece that brings the arguments' "{"
    assert all("tool_calls" not in d for deltas in given[:at] for d in deltas)
    first, piece = given[at]
    assert first["tool_calls"][0]["id"].startswith("call_") and first["tool_calls"][0]["function"]["name"] == "get_time"
    assert piece == {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
    for i in range(at + 1, at + len(arguments)):  # every later character of the arguments, at once
        assert given[i] == [{"tool_calls": [{"index": 0, "function": {"arguments": text[i]}}]}], i
    assert given[at + len(arguments)] == []  # the call's own "}" is not an argument
    # a piece that brings text, a whole call and the next call's start comes out in order
    content, calls, called, given = _fed(text, size=len(head) + 20)
    assert [next(iter(d)) for d in given[0]] == ["content", "tool_calls", "tool_calls"]


def test_the_stream_of_a_bare_json_answer():
    call = '{"name": "get_time", "parameters": {"zone": "cet"}}'
    assert _agrees("  " + call) == ("", [("get_time", '{"zone": "cet"}')], True)
    # Llama's tag, calls after ";"; the leading blanks and the tag are no content
    assert _agrees("<|python_tag|>" + call + ";" + call) == ("", [("get_time", '{"zone": "cet"}')] * 2, True)
    # held no longer than the head: the arguments start out before the answer ends
    _, _, _, given = _fed("  " + call)
    assert any("tool_calls" in d for deltas in given[:len(call) - 5] for d in deltas)
    # JSON that is no call is content, sent as soon as its first key shows it
    content, calls, _, given = _fed('{"answer": 42}')
    assert content == '{"answer": 42}' and not calls and given[2] == [{"content": '{"a'}]


# -- the template and the grammar --------------------------------------------------------------
def test_the_format_comes_from_the_template():
    import copy

    from tests.helpers import byte_tokenizer

    tok = copy.deepcopy(byte_tokenizer())  # the cached one is every test's: left as it is
    assert ToolFormat.of(tok) is None  # no tools in its template
    tok.chat_template = HERMES
    assert ToolFormat.of(tok) == HERMES_FORMAT  # "<tool_call>" is text there: quoted
    tok.chat_template = LLAMA
    assert ToolFormat.of(tok) == JSON_FORMAT


def test_check_tools_names_the_bad_tool():
    check_tools(TOOLS)
    with pytest.raises(ValueError, match="'broken'"):
        check_tools([*TOOLS, {"type": "function", "function": {"name": "broken",
                                                               "parameters": {"type": "objectx"}}}])
    with pytest.raises(ValueError, match="named 'get_time'"):
        check_tools([*TOOLS, TOOLS[1]])
    with pytest.raises(ValueError, match="tools\\[0\\]"):
        check_tools([{"type": "function", "function": {"name": "has space"}}])


def _accepted(compiler, grammar, tok, text: str) -> bool:
    constraint = compiler.constraint(grammar)
    for token in tok.encode(text, add_special_tokens=False):
        if not constraint.allowed()[token]:
            return False
        constraint.commit([token])
    return bool(constraint.allowed()[sorted(compiler.eos_ids)[0]])  # complete: the end may follow


def test_the_grammar_takes_calls_of_the_forced_tools_only():
    from anydraft.constraints.matcher import Compiler
    from tests.helpers import byte_tokenizer

    tok = byte_tokenizer()
    compiler = Compiler(tok, len(tok), frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c", "days": 3}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    many = call_grammar(HERMES_FORMAT, TOOLS, many=True)
    assert _accepted(compiler, many, tok, weather) and _accepted(compiler, many, tok, weather + "\n" + time)
    assert not _accepted(compiler, many, tok, weather.replace('"days": 3', '"days": 9'))
    assert not _accepted(compiler, many, tok, "Sure! " + weather)
    named = call_grammar(HERMES_FORMAT, TOOLS[1:], many=False)
    assert _accepted(compiler, named, tok, time) and not _accepted(compiler, named, tok, weather)
    assert not _accepted(compiler, named, tok, time + "\n" + time)
    # a schema with definitions of its own (as pydantic writes them), inside the call's schema
    located = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Place"}}, "required": ["at"],
               "additionalProperties": False,
               "$defs": {"Place": {"type": "string", "enum": ["home", "work"]}}}
    where = [{"type": "function", "function": {"name": "go", "parameters": located}}]
    check_tools(where)
    call = '<tool_call>\n{"name": "go", "arguments": {"at": "home"}}\n</tool_call>'
    for tools in (where, where + TOOLS):
        grammar = call_grammar(HERMES_FORMAT, tools, many=False)
        assert _accepted(compiler, grammar, tok, call)
        assert not _accepted(compiler, grammar, tok, call.replace("home", "mars"))
    llama = call_grammar(JSON_FORMAT, TOOLS, many=False)
    assert _accepted(compiler, llama, tok, '{"name": "get_time", "parameters": {"zone": "cet"}}')
    assert "x-guidance" in many.source and json.dumps(JSON_LAYOUT) in many.source


def test_qwen_renders_tools_and_a_tool_loop_and_its_grammar_takes_its_own_call():
    """The catalog's Qwen2.5 template: the tools in its system turn, an earlier call and its
    result in the shape Hugging Face templates take (arguments an object); ``<tool_call>``
    is a token of its own there, which the grammar names as such."""
    from anydraft.chat import chat_ids
    from anydraft.constraints.matcher import Compiler
    from anydraft.models.loading import load_tokenizer
    from anydraft.server.schemas import ChatCompletionRequest

    tok = load_tokenizer(require_model("qwen2.5-coder-0.5b"))
    fmt = ToolFormat.of(tok)
    assert fmt == ToolFormat("hermes", "arguments", "<tool_call>", "</tool_call>")
    req = ChatCompletionRequest.model_validate({"model": "m", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"unit": "c", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]})
    messages = [m.as_template_message() for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    text = tok.decode(chat_ids(tok, messages, tools=tools))
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c", "days": 2}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert tok.decode(chat_ids(tok, messages[:1])) != tok.decode(chat_ids(tok, messages[:1], tools=tools))
    eos = frozenset(tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    compiler = Compiler(tok, len(tok), eos)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "f", "days": 5}}\n</tool_call>'
    assert _accepted(compiler, call_grammar(fmt, TOOLS, many=True), tok, call)


# -- the server --------------------------------------------------------------------------------
def test_a_template_without_tools_is_a_400_and_none_renders_nothing(server, decoder):
    r = httpx.post(server.base + CHAT, json=chat_body(tools=TOOLS), timeout=60)
    assert r.status_code == 400 and "chat template has no tools" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "tools"
    ref = decoder.generate("hello there", max_new_tokens=12, temperature=0.0).text
    r = httpx.post(server.base + CHAT, json=chat_body(tools=TOOLS, tool_choice="none"), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ref


@pytest.mark.parametrize("body,words", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "objectx"}}}]}, "'x'"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": [1]}}]}, "tools.0.function.parameters"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": TOOLS + TOOLS[:1]}, "two tools are named 'get_weather'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "only allowed when tools are given"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"functions": [{"name": "f"}]}, "use tools"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, None),  # empty: fine
    ({"messages": [{"role": "user", "content": "x",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "only in assistant messages"),
])
def test_bad_tools_are_400s_naming_them(server, body, words):
    r = httpx.post(server.base + CHAT, json=chat_body(**body), timeout=60)
    if words is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"], r.json()


@pytest.fixture(scope="module")
def tool_servers(decoder):
    """In-process servers over the tiny model whose tokenizer has a Hermes or a Llama-3 template."""
    import copy
    from contextlib import ExitStack

    from anydraft import Decoder
    from anydraft.server.app import create_app
    from anydraft.server.config import ServerConfig
    from tests.server.conftest import serve_in_thread

    with ExitStack() as stack:
        bases = {}
        for name, template in (("hermes", HERMES), ("llama", LLAMA)):
            tok = copy.deepcopy(decoder.target.tokenizer)
            tok.chat_template = template
            dec = Decoder(target=decoder.target.model, tokenizer=tok, dtype="float32")
            app = create_app([dec], ServerConfig(model_id=MODEL_ID))
            bases[name] = stack.enter_context(serve_in_thread(app))
        yield bases


def _client(base):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def _streamed(chunks) -> tuple[str, list, str]:
    """A stream's content, its tool calls put together as the openai client's users do, and
    its finish reason."""
    content, calls, reason = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            call["id"] = delta.id or call["id"]
            if delta.function:
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("style", ["hermes", "llama"])
@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_calls_always_parse(tool_servers, style, stream):
    """The random model writes noise: only the grammar makes it a call, and then it always
    reads back as one, whose arguments validate."""
    messages = [{"role": "user", "content": "the quick brown fox"}]
    with _client(tool_servers[style]) as client:
        for seed, choice in enumerate(["required", {"type": "function", "function": {"name": "get_time"}},
                                       "required"]):
            kwargs = dict(model=MODEL_ID, messages=messages, tools=TOOLS, tool_choice=choice,
                          parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed)
            if stream:
                content, calls, reason = _streamed(client.chat.completions.create(stream=True, **kwargs))
                assert content == ""
            else:
                answer = client.chat.completions.create(**kwargs).choices[0]
                reason, calls = answer.finish_reason, [c.model_dump() for c in answer.message.tool_calls]
                assert answer.message.content is None
            assert reason == "tool_calls" and len(calls) == 1
            _check_calls(calls)
            if isinstance(choice, dict):
                assert calls[0]["function"]["name"] == "get_time"


@pytest.mark.parametrize("style", ["hermes", "llama"])
def test_one_greedy_generation_streamed_and_not_gives_the_same_calls(tool_servers, style):
    """The streamed arguments, put together, are the non-streamed answer's; so are the names,
    the content and the finish reason, whole or cut short inside a call."""
    messages = [{"role": "user", "content": "hello there"}]
    with _client(tool_servers[style]) as client:
        whole = None
        # one byte a token: the second cut falls inside the first call's arguments
        for max_tokens in (300, {"hermes": 55, "llama": 44}[style]):
            kwargs = dict(model=MODEL_ID, messages=messages, tools=TOOLS, tool_choice="required",
                          max_tokens=max_tokens, temperature=0.0)
            answer = client.chat.completions.create(**kwargs).choices[0]
            content, calls, reason = _streamed(client.chat.completions.create(stream=True, **kwargs))
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            assert calls == [(c.function.name, c.function.arguments) for c in answer.message.tool_calls or ()]
            assert (content.strip() or None, reason) == (answer.message.content, answer.finish_reason)
            if whole is None:
                assert reason == "tool_calls" and content == ""
                json.loads(calls[0][1])
                whole = calls
            else:  # what was sent of the same call, cut short: "length"
                assert reason == "length" and len(calls) == 1 and calls[0][0] == whole[0][0]
                assert whole[0][1].startswith(calls[0][1]) and calls[0][1] != whole[0][1]


def test_parallel_calls_and_a_three_turn_loop(tool_servers):
    with _client(tool_servers["hermes"]) as client:
        messages = [{"role": "user", "content": "hello there"}]
        answer = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=TOOLS,
                                                tool_choice="required", max_tokens=600,
                                                temperature=1.0, seed=5, n=3).choices
        for choice in answer:  # several calls may follow each other; each parses
            if choice.finish_reason == "tool_calls":
                _check_calls([c.model_dump() for c in choice.message.tool_calls])
            else:
                assert choice.finish_reason == "length"
        called = next(c for c in answer if c.finish_reason == "tool_calls").message
        messages += [called.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "21 C"} for c in called.tool_calls]
        final = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=TOOLS,
                                               max_tokens=8, temperature=0.0)
        assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
        content, calls, reason = _streamed(client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=TOOLS, max_tokens=8, temperature=0.0, stream=True))
        assert content == (final.choices[0].message.content or "") and reason == final.choices[0].finish_reason


# -- a real model ------------------------------------------------------------------------------
@pytest.mark.real
@pytest.mark.slow
def test_a_three_turn_tool_loop_on_qwen_with_the_openai_client(tmp_path):
    """The official client: a forced call, the tool's result, then an answer with "auto", on
    the catalog's Qwen2.5 (llama.cpp), streamed and not."""
    require_llamacpp()
    require_model("qwen2.5-coder-0.5b")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                       "required": ["city"], "additionalProperties": False}}}]
    server = Server("qwen2.5-coder-0.5b", tmp_path / "server.log", "--target-backend", "llamacpp")
    try:
        server.wait_ready()
        with _client(server.base) as client:
            for stream in (False, True):
                messages = [{"role": "user", "content": "What is the weather in Paris?"}]
                kwargs = dict(model=MODEL_ID, tools=tools, max_tokens=60, temperature=0.0)
                if stream:
                    _, calls, reason = _streamed(client.chat.completions.create(
                        messages=messages, tool_choice="required", parallel_tool_calls=False,
                        stream=True, **kwargs))
                else:  # one call: with more allowed, this small model asks for other cities too
                    answer = client.chat.completions.create(messages=messages, tool_choice="required",
                                                            parallel_tool_calls=False, **kwargs).choices[0]
                    reason, calls = answer.finish_reason, [c.model_dump() for c in answer.message.tool_calls]
                assert reason == "tool_calls" and calls[0]["function"]["name"] == "get_weather"
                assert "paris" in json.loads(calls[0]["function"]["arguments"])["city"].lower()
                messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                             {"role": "tool", "tool_call_id": calls[0]["id"],
                              "content": '{"temperature_c": 21, "sky": "sunny"}'}]
                if stream:
                    content, calls, reason = _streamed(client.chat.completions.create(
                        messages=messages, tool_choice="auto", stream=True, **kwargs))
                else:
                    answer = client.chat.completions.create(messages=messages, tool_choice="auto",
                                                            **kwargs).choices[0]
                    content, calls, reason = answer.message.content, answer.message.tool_calls, answer.finish_reason
                # greedy, this small model calls again, then writes the tool's result as its
                # answer: the call goes out, the text after it is content, the reason "stop"
                assert reason in ("stop", "length"), (content, calls)
                assert "21" in content, content
    finally:
        server.stop()
    assert "Traceback" not in server.log(), server.log()
