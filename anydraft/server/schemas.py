"""Request bodies of the OpenAI endpoints, validated strictly (no type coercion).

Unsupported OpenAI features are rejected with a message rather than silently ignored;
unknown fields are ignored, as clients send many optional ones.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..constraints.grammar import Grammar
from ..errors import AnydraftError
from ..sampling import MAX_TOP_LOGPROBS
from .tools import check_tools

MAX_TOKENS_CAP = 1_000_000  # a static sanity bound; the context window is checked per request
MAX_STOP = 4
# completions of one request (``n``): each is a generation of its own, a batch row while it
# runs and a place in the queue while it waits, so one request may take at most this many
MAX_N = 16
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, OpenAI's cap
MAX_TOOLS = 128  # tools of one request, OpenAI's cap
TOP_K_OFF = -1  # vLLM's spelling of "no top-k", which clients built for vLLM send


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    # sampling: only the types here; `SamplingParams` validates the values (generation.py),
    # except for OpenAI's own cap on the temperature
    temperature: float | None = Field(None, le=2)
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM-style: -1 or 0 = off)
    min_p: float | None = None  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool | None = None  # null: not streamed, as OpenAI's own server takes it
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(None, max_length=512)
    # extension: "ar" decodes this request plainly, without the server's --method (the
    # playground's "compare with plain decoding"); nothing else may be chosen per request
    anydraft_method: Literal["ar"] | None = None
    # structured outputs: OpenAI's {"type": "text" | "json_object" | "json_schema", ...}
    response_format: dict | None = None
    # extension: the output matches a regex or a Lark grammar ({"regex": ...} or {"lark": ...})
    anydraft_grammar: dict | None = None

    @model_validator(mode="after")
    def _supported(self):
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise ValueError(f"{name}: penalties are not supported (they would change the "
                                 "target distribution); leave it out or pass 0")
        for key in self.logit_bias or ():
            if not key.isascii() or not key.isdigit():  # JSON keys are strings: "50256"
                raise ValueError(f"logit_bias: keys must be token ids as decimal strings "
                                 f"(e.g. {{\"50256\": -100}}), got {key!r}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream=true (as in vLLM)")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop: stop sequences must be non-empty strings")
        if any(len(s) > 1000 for s in stops):
            raise ValueError("stop: a stop sequence may be at most 1000 characters")
        self.grammar  # noqa: B018 - malformed formats and grammars fail here, with their field
        return self

    @property
    def grammar(self) -> Grammar | None:
        """What the output must match (`response_format` or `anydraft_grammar`; None: text)."""
        if self.response_format is not None and self.anydraft_grammar is not None:
            raise ValueError("anydraft_grammar: give response_format or anydraft_grammar, not both")
        try:
            if self.anydraft_grammar is not None:
                given = self.anydraft_grammar
                if len(given) != 1 or next(iter(given)) not in ("regex", "lark"):
                    raise ValueError("anydraft_grammar: one of {\"regex\": \"...\"} or {\"lark\": \"...\"}")
                (kind, source), = given.items()
                return Grammar(kind, source)
            return _format_grammar(self.response_format)
        except AnydraftError as exc:
            field = "anydraft_grammar" if self.anydraft_grammar is not None else "response_format"
            raise ValueError(f"{field}: {exc}") from None

    @property
    def sampling_fields(self) -> dict:
        """The `SamplingParams` fields this request sets (None: not set)."""
        top_k = None if self.top_k == TOP_K_OFF else self.top_k
        bias = None if self.logit_bias is None else {int(k): v for k, v in self.logit_bias.items()}
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=top_k,
                    min_p=self.min_p, seed=self.seed, logit_bias=bias)

    @property
    def choices(self) -> int:
        """Completions asked for (``n``)."""
        return self.n or 1

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _format_grammar(response_format: dict | None) -> Grammar | None:
    """OpenAI's ``response_format``: text (None), any JSON object, or a JSON schema (``strict``
    or not, the schema is enforced: the output always validates)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format: json_schema needs {\"json_schema\": {\"name\": ..., "
                             "\"schema\": {...}}}")
        return Grammar("json_schema", spec["schema"])
    raise ValueError(f"response_format: type must be text, json_object or json_schema, got {kind!r}")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str = Field(min_length=1, max_length=256)
    arguments: str  # JSON text, as OpenAI writes it


class ToolCall(_Strict):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # null or left out: an assistant turn that only called tools
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = Field(None, max_length=256)  # a tool turn: the call it answers

    @model_validator(mode="after")
    def _content(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content: may be null or left out only in assistant messages, not {self.role}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls: only in assistant messages, not {self.role}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message needs the id of the call it answers")
        return self

    def as_template_message(self) -> dict:
        """The message as Hugging Face chat templates take it: content a string; tool calls
        with their arguments as an object (templates write them with ``tojson``)."""
        if self.content is None:
            content = ""
        elif isinstance(self.content, str):
            content = self.content
        else:
            content = "".join(p.text for p in self.content)
        # chat templates know "system"; OpenAI's newer "developer" role means the same thing
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in self.tool_calls]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                message["name"] = self.name
        return message


def _arguments(text: str):
    """A call's arguments as an object where they are a JSON object (else the text itself)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


class FunctionSpec(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema (None: no arguments)
    strict: bool | None = None  # the arguments are enforced where a grammar forces calls, either way


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedTool(_Strict):
    name: str


class ToolChoice(_Strict):
    type: Literal["function"]
    function: NamedTool


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolSpec] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list | None = None
    function_call: str | dict | None = None

    @model_validator(mode="after")
    def _chat_supported(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true, as in OpenAI's API")
        if self.functions:
            raise ValueError("functions: the legacy functions API is not supported: use tools")
        if self.function_call not in (None, "none"):
            raise ValueError("function_call: the legacy functions API is not supported: use "
                             "tools and tool_choice")
        if self.tools:
            check_tools([t.model_dump() for t in self.tools])
        if self.tool_choice in (None, "none"):
            return self
        if not self.tools:  # as OpenAI answers
            raise ValueError("tool_choice: only allowed when tools are given")
        if self.tool_choice == "auto":
            return self
        if isinstance(self.tool_choice, ToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice: names {name!r}, which is not one of the tools")
        if self.response_format is not None or self.anydraft_grammar is not None:
            field = "response_format" if self.response_format is not None else "anydraft_grammar"
            raise ValueError(f"{field}: tool_choice {self.tool_choice_name!r} constrains the answer "
                             "to tool calls already: leave one of them out")
        return self

    @property
    def tool_choice_name(self) -> str:
        choice = self.tool_choice
        return choice.function.name if isinstance(choice, ToolChoice) else (choice or "auto")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def top_alternatives(self) -> int | None:
        """Alternatives per token to report with its log-probability (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool | None = None
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = None

    @model_validator(mode="after")
    def _completion_supported(self):
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: give one string (batched prompts are not supported)")
        if self.echo:
            raise ValueError("echo: not supported")
        if self.suffix:
            raise ValueError("suffix: not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of: only best_of=1 is supported")
        return self

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def top_alternatives(self) -> int | None:
        """Alternatives per token to report with its log-probability (None: no logprobs)."""
        return self.logprobs
