"""Chat messages to target token ids: the chat template's own markers are special tokens, the
messages' content is text (issue 42).

Tokenizing the rendered template in one piece reads ``<|im_start|>`` typed inside a message
as the control token, so a user could open turns of their own (a system turn, say). Content
that holds the text of a special token is therefore tokenized on its own with special tokens
read as text, and the template's text around it with them read as special. Content without
such text takes the one-piece path, so ordinary prompts tokenize exactly as before.
"""

from __future__ import annotations

import json
import uuid

from .errors import AnydraftError


def chat_ids(tok, messages: list[dict], special_in_content: bool = False,
             tools: list[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` rendered by ``tok``'s chat template with the generation
    prompt. ``special_in_content``: read special tokens in the content as special too (the
    old behaviour, ``anydraft serve --allow-special-in-content``). ``tools``: function
    definitions the template renders (OpenAI's ``tools``; None: none)."""
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    specials = [t.content for t in tok.added_tokens_decoder.values() if t.special]
    # tools and earlier tool calls are rendered as JSON, not as a content that can be kept apart
    rendered_json = json.dumps([tools, [m.get("tool_calls") for m in messages]], ensure_ascii=False)
    if not special_in_content and any(s in rendered_json for s in specials):
        raise AnydraftError(
            "a tool definition or tool call holds the text of a special token: leave the special "
            "tokens out (or start the server with --allow-special-in-content to read them as special)")
    contents = [m.get("content") if isinstance(m.get("content"), str) else None for m in messages]
    if special_in_content or not any(c and any(s in c for s in specials) for c in contents):
        return tok.encode(text, add_special_tokens=False)
    # render again with a mark for each content: the template's own text lies between them
    marks = [None if c is None else f"\x00{uuid.uuid4().hex}\x00" for c in contents]
    rendered = tok.apply_chat_template(
        [m if mark is None else {**m, "content": mark} for m, mark in zip(messages, marks, strict=True)],
        tools=tools, tokenize=False, add_generation_prompt=True)
    pieces, rest = [], rendered  # (text, whether it is the template's own)
    for content, mark in zip(contents, marks, strict=True):
        if mark is not None and mark in rest:  # a template may leave a message out
            before, _, rest = rest.partition(mark)
            pieces += [(before, True), (content, False)]
    pieces.append((rest, True))
    if "".join(piece for piece, _ in pieces) != text:
        raise AnydraftError(
            "a message holds the text of a special token, and this chat template changes message "
            "content, so it cannot be kept apart as text: leave the special tokens out of the "
            "messages (or start the server with --allow-special-in-content to read them as special)")
    ids = []
    for piece, template in pieces:
        if piece:
            ids += tok.encode(piece, add_special_tokens=False, split_special_tokens=not template)
    return ids
