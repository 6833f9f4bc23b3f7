"""Log-probabilities as OpenAI writes them: chat's ``content`` list of entries, or completions'
parallel lists."""

from __future__ import annotations

# a log-probability JSON cannot carry (-inf: a token the sampling settings ruled out), as
# vLLM spells it
LOGPROB_FLOOR = -9999.0


def spellings_of(decoder) -> tuple[bytes, ...]:
    """Each of ``decoder``'s target token ids as logprobs spell it: its bytes, or a special
    token's name (``<|im_end|>``, as its tokenizer gives it). Built once at start-up
    (`ServerState.build`), before the workers start: the event loop then spells tokens without
    a tokenizer, which a worker may be using (a Hugging Face tokenizer is not thread-safe)."""
    table, tokenizer = decoder.table, decoder.target.tokenizer
    spelt = list(table.token_bytes)
    for t in table.special_ids:
        spelt[t] = (tokenizer.convert_ids_to_tokens(t) or "").encode()
    return tuple(spelt)


def logprobs_json(spellings: tuple[bytes, ...], entries: list, chat: bool,
                  offset: int = 0) -> tuple[dict, int]:
    """``entries`` (`TokenLogprob`s of the target whose tokens ``spellings`` spells,
    `spellings_of`) as OpenAI writes a choice's ``logprobs``: chat's ``content`` list, or
    completions' parallel lists (``text_offset`` counted from ``offset`` characters); and the
    offset after them. An id past the vocabulary (padded logits) is spelt as nothing."""

    def token(t: int) -> tuple[str, list[int]]:
        spelt = spellings[t] if t < len(spellings) else b""
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
