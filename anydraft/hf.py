"""`anydraft.hf.generate`: anydraft's decoding loop in place of transformers' own.

    import anydraft.hf
    out = model.generate(**inputs, custom_generate=anydraft.hf.generate, assistant_model=a,
                         tokenizer=t, assistant_tokenizer=at, max_new_tokens=128)

transformers (5.x) prepares the call as always (generation config, left-padded inputs,
stopping criteria, logits processors) and hands it to `generate` instead of its sampling
loop. Each row then decodes with anydraft's methods (`auto` by default: any drafter
tokenizer, adaptive draft length), all rows together, and the result is what transformers
returns: the sequences, padded with the pad id after a row's end, or a
`GenerateDecoderOnlyOutput` with ``return_dict_in_generate=True``.

The output is plain decoding's: greedy token for token (float32), sampled in distribution,
with transformers' own end-of-sequence ids, stopping criteria, ``max_new_tokens`` and streamer.
Of the logits processors, those anydraft applies identically in drafting and verification
map to `SamplingParams` (temperature, top-k, top-p, min-p); any other is refused by name.
"""

from __future__ import annotations

import inspect

import torch

from .config import DraftConfig
from .decoder import Decoder
from .decoding import Batch
from .errors import AnydraftError
from .request import RequestOptions
from .sampling import MAX_SEED, SamplingParams

# model keywords `generate` prepares for its own loop; anydraft's sessions keep their own cache
# and positions, so these carry nothing it needs (an attention mask says where padding is)
PREPARED = {"attention_mask", "cache", "past_key_values", "use_cache", "logits_to_keep",
            "position_ids", "cache_position"}
# outputs beside the sequences that plain decoding computes and anydraft's steps do not
UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
# the logits processors anydraft applies itself, in its order (sampling.py)
WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper")


def generate(model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, assistant_model=None, tokenizer=None,
             assistant_tokenizer=None, streamer=None, synced_gpus: bool = False,
             draft: DraftConfig | None = None, method: str | None = None,
             anydraft_handed: dict | None = None, **model_kwargs):
    """transformers' decoding loop, run by anydraft (pass it as ``custom_generate=``).

    Besides `generate`'s own keywords: ``draft``, a `DraftConfig` (method, draft length,
    adaptive drafting), and ``method``, a shortcut for its method. ``assistant_model`` (None:
    no drafter, `auto` copies from the prompt) with ``assistant_tokenizer``, and the target's
    ``tokenizer``, are those of transformers' assisted generation; ``synced_gpus`` is
    ignored (one process decodes every row). Stopping criteria are asked row by row (a 1-row
    ``input_ids``, ``scores=None``) after every new token."""
    handed = anydraft_handed or {}
    assistant = assistant_model if assistant_model is not None else handed.get("assistant_model")
    if assistant_tokenizer is None:
        assistant_tokenizer = handed.get("assistant_tokenizer")
    config = generation_config
    _check_request(model, config, model_kwargs)
    params = sampling_params(logits_processor or (), config)
    decoder = _decoder(model, tokenizer, assistant, assistant_tokenizer, draft, method)
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"))
    max_new = config.max_length - input_ids.shape[1]
    eos = _ids(config._eos_token_tensor)
    pad = _ids(config._pad_token_tensor)
    stops = [_RowStop(stopping_criteria or (), input_ids[i].cpu()) for i in range(len(prompts))]
    rows = decoder.new_rows(len(prompts)) if len(prompts) > 1 else None
    request = RequestOptions(max_new, params)
    batch, generations = Batch(), []
    for ids, stop in zip(prompts, stops, strict=True):
        generations.append(decoder.start_ids(ids, request, rows=rows, cancel=stop.cancel,
                                             eos_ids=frozenset(eos), generator=row_generator()))
        batch.join(generations[-1])
    outputs = _Outputs(generations, stops, pad, streamer)
    while batch:
        batch.run_once()
        outputs.stream()
    outputs.stream(final=True)
    sequences = torch.cat([input_ids, outputs.tensor().to(input_ids.device)], dim=1)
    if config.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def row_generator() -> torch.Generator:
    """Each row's random source, seeded from torch's global one: ``torch.manual_seed`` before
    `generate` repeats a sampled output, as it does for transformers' own sampling."""
    seed = int(torch.randint(0, MAX_SEED, ()))
    return torch.Generator().manual_seed(seed)


def sampling_params(processors, config) -> SamplingParams:
    """The `SamplingParams` that apply ``processors`` (transformers' logits processors, in
    order), or an error naming the first one anydraft cannot apply identically."""
    if not config.do_sample:
        # greedy takes the argmax, which no warper moves; anything else changes it
        others = [p for p in processors if type(p).__name__ not in WARPERS]
        if others:
            raise _refused(others[0])
        return SamplingParams()
    settings, last = {}, -1
    for p in processors:
        kind = type(p).__name__
        if kind not in WARPERS or getattr(p, "min_tokens_to_keep", 1) != 1 or \
                getattr(p, "filter_value", -float("inf")) != -float("inf"):
            raise _refused(p)
        order = WARPERS.index(kind)
        if order <= last:  # anydraft's order: temperature, top-k, top-p, min-p, each once
            raise AnydraftError(f"logits processor {kind} comes after "
                                f"{WARPERS[last]}: anydraft applies temperature, top-k, top-p "
                                "and min-p in that order, once each; pass them in that order")
        last = order
        field = ("temperature", "top_k", "top_p", "min_p")[order]
        settings[field] = getattr(p, field)
    settings.setdefault("temperature", 1.0)
    return SamplingParams(**settings)


def _refused(processor) -> AnydraftError:
    return AnydraftError(
        f"logits processor {type(processor).__name__} is not supported by anydraft.hf.generate: "
        "it can apply only temperature, top_k, top_p and min_p exactly in drafting and "
        "verification; leave it out of the generation config or logits_processor (or call "
        "generate without custom_generate)")


def _check_request(model, config, model_kwargs) -> None:
    if model.config.is_encoder_decoder:
        raise AnydraftError("anydraft.hf.generate runs decoder-only models: call generate "
                            "without custom_generate for an encoder-decoder model")
    if (config.num_beams or 1) > 1:
        raise AnydraftError(f"num_beams={config.num_beams}: anydraft.hf.generate decodes "
                            "greedily or samples; leave out num_beams (or set it to 1)")
    for name in UNSUPPORTED_OUTPUTS:
        if getattr(config, name, False):
            raise AnydraftError(f"{name}=True is not supported by anydraft.hf.generate: it "
                                f"returns the sequences only; leave out {name}")
    for name, value in model_kwargs.items():
        if name not in PREPARED and value is not None:
            raise AnydraftError(f"anydraft.hf.generate reads token ids only: {name} is not "
                                "supported; pass input_ids (and attention_mask)")
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:
        raise AnydraftError("anydraft.hf.generate keeps its own cache: pass no filled "
                            "past_key_values / cache")


def _decoder(model, tokenizer, assistant, assistant_tokenizer, draft, method):
    """The `Decoder` of this target, drafter and settings: built once, so what adaptive drafting
    learns about the pair lasts from call to call."""
    if tokenizer is None:
        raise AnydraftError("anydraft.hf.generate needs the target's tokenizer: pass "
                            "tokenizer=... to generate")
    if assistant is not None and assistant_tokenizer is None:
        assistant_tokenizer = tokenizer  # transformers' rule too: no assistant_tokenizer, same one
    draft = draft or DraftConfig()
    if not isinstance(draft, DraftConfig):
        raise AnydraftError(f"draft must be an anydraft.DraftConfig, got {type(draft).__name__}")
    key = (id(tokenizer), id(assistant), id(assistant_tokenizer), draft, method)
    cache = model.__dict__.setdefault("_anydraft_decoders", {})
    if key not in cache:
        cache[key] = Decoder(model, assistant, draft=draft, method=method, tokenizer=tokenizer,
                             drafter_tokenizer=assistant_tokenizer, device=model.device.type)
    return cache[key]


def _prompts(input_ids, attention_mask) -> list[list[int]]:
    """Each row's prompt without its left padding (transformers drops an all-ones mask)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise AnydraftError("input_ids must be a (batch, length) tensor with a token per row")
    if attention_mask is None:
        return input_ids.tolist()
    mask = attention_mask.bool().cpu()
    starts = mask.int().argmax(dim=1).tolist()
    prompts = []
    for i, start in enumerate(starts):
        if not mask[i, start:].all() or not mask[i].any():
            raise AnydraftError("anydraft.hf.generate reads left-padded batches: tokenize with "
                                "padding_side='left'")
        prompts.append(input_ids[i, start:].tolist())
    return prompts


def _ids(tensor) -> list[int]:
    return [] if tensor is None else [int(t) for t in torch.as_tensor(tensor).flatten()]


class _RowStop:
    """transformers' stopping criteria for one row, asked after each of its new tokens: where
    they first say stop (`cut`: the new tokens kept), and, as the generation's ``cancel``, that
    it should stop there. Tokens a step committed after that point are dropped, as plain
    decoding would never have made them."""

    def __init__(self, criteria, prompt: torch.Tensor):
        self.criteria, self.prompt = criteria, prompt
        self.generation = None  # set once started
        self.checked = 0
        self.cut: int | None = None

    def scan(self) -> None:
        if self.cut is not None or self.generation is None or not self.criteria:
            return
        new = self.generation.state.committed[self.generation.prompt_tokens:]
        for j in range(self.checked, len(new)):
            row = torch.cat([self.prompt, torch.tensor(new[: j + 1], dtype=self.prompt.dtype)])
            if bool(self.criteria(row.unsqueeze(0), None).any()):
                self.cut = j + 1
                return
        self.checked = len(new)

    def cancel(self) -> str | None:
        self.scan()
        return "stopping_criteria" if self.cut is not None else None

    def tokens(self) -> list[int]:
        self.scan()
        new = self.generation.state.committed[self.generation.prompt_tokens:]
        return new if self.cut is None else new[: self.cut]


class _Outputs:
    """The rows' new tokens as transformers returns and streams them: one column per step of
    plain decoding, the pad id after a row has ended."""

    def __init__(self, generations, stops, pad: list[int], streamer):
        for generation, stop in zip(generations, stops, strict=True):
            stop.generation = generation
        self.generations, self.stops, self.streamer = generations, stops, streamer
        self.pad = pad[0] if pad else None
        self.streamed = 0

    def columns(self, final: bool) -> int:
        """How many columns every row has settled: a token, or padding after its end."""
        lengths = [len(s.tokens()) for s in self.stops]
        if final:
            return max(lengths)
        open_rows = [n for n, g, s in zip(lengths, self.generations, self.stops, strict=True)
                     if not g.done and s.cut is None]
        return min(open_rows) if open_rows else max(lengths)

    def tensor(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        rows = [s.tokens() for s in self.stops]
        end = max(map(len, rows)) if end is None else end
        if any(len(r) < end for r in rows) and self.pad is None:
            raise AnydraftError("rows ended at different lengths and the model has no pad token: "
                                "pass pad_token_id=... to generate")
        return torch.tensor([(r + [self.pad] * (end - len(r)))[start:end] for r in rows],
                            dtype=torch.long).reshape(len(rows), end - start)

    def stream(self, final: bool = False) -> None:
        if self.streamer is None:
            return
        end = self.columns(final)
        for column in range(self.streamed, end):
            self.streamer.put(self.tensor(column, column + 1)[:, 0])
        self.streamed = max(self.streamed, end)
        if final:
            self.streamer.end()


def _install_handover() -> None:
    """transformers 5.x hands a callable ``custom_generate`` only the keywords it declares
    beyond `_sample`'s, and takes ``assistant_model``, ``tokenizer``, ``assistant_tokenizer``
    and ``streamer`` away first. For `generate` alone they are handed over: the tokenizer and
    streamer as they are (transformers builds ``stop_strings``' criteria with that tokenizer),
    the assistant as ``anydraft_handed``, out of reach of the checks transformers makes for its
    own assisted generation (which compare vocabulary sizes). Every other callable gets what
    it got before."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin._extract_generation_mode_kwargs
    if getattr(original, "anydraft", False):
        return
    signature = inspect.signature(original)
    if not {"custom_generate", "kwargs", "assistant_model", "streamer"} <= set(signature.parameters):
        return  # another transformers: whatever it hands over is what `generate` gets

    def extract(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        tokenizers = {name: bound["kwargs"].get(name) for name in ("tokenizer", "assistant_tokenizer")}
        result = original(*args, **kwargs)
        if bound["custom_generate"] is generate:
            given = {"tokenizer": tokenizers["tokenizer"], "streamer": bound["streamer"]}
            result.update({k: v for k, v in given.items() if v is not None})
            result["anydraft_handed"] = {"assistant_model": bound["assistant_model"],
                                         "assistant_tokenizer": tokenizers["assistant_tokenizer"]}
        return result

    extract.anydraft = True
    GenerationMixin._extract_generation_mode_kwargs = extract


_install_handover()
