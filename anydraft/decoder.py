"""`Decoder`: the public entry point. Loads models, prepares prompts, runs the decoding loop.

    from anydraft import Decoder
    dec = Decoder(target="qwen2.5-coder-1.5b", drafter="smollm2-135m", method="auto")
    out = dec.generate("Write a haiku", max_new_tokens=64)
    out.text, out.token_ids, out.stats
    for delta in dec.stream("Write a haiku"): print(delta, end="")

Draft settings are a `DraftConfig` (``draft=``), a request's settings a `RequestOptions`
(anydraft/request.py: the keyword arguments `generate`, `stream`, `generate_batch` and `start`
share), its sampling settings a `SamplingParams` (``sampling=``); keyword shortcuts
(``method=``, ``num_draft_tokens=``, ``temperature=``, ...) override single fields of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from . import methods
from .bridge import token_table
from .chat import chat_ids
from .config import DraftConfig, check_method, override
from .constraints.grammar import GRAMMAR_METHODS
from .constraints.matcher import Compiler
from .decoding import Batch, DecodeState, Finish, Generation, GenerationOutput, Stats, TextAssembler
from .errors import AnydraftError
from .models.auto import cached_curve
from .models.backends import backend_for, check_backend, check_target_device, load
from .models.batch import Rows, RowView
from .models.exact_cost import choose as choose_exact
from .models.loaded import LoadedModel
from .models.loading import parse_dtype, resolve_device
from .models.prefix import PrefixCache, default_prefix_cache_mb
from .models.session import close_session
from .planning.cost import drafting_pays
from .planning.estimates import Costs, Estimates
from .planning.settings import SETTINGS
from .request import RequestOptions


def _eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """Every id that ends generation: the byte table's and the model files' own."""
    return frozenset(set(token_table(loaded.tokenizer).eos_ids) | loaded.model_eos_ids)


def _drafting_pays(loaded: LoadedModel, spec, target_curve: dict | None, progress) -> bool:
    """Whether ``auto`` drafts with the drafter: not where the measured curves say no draft of it
    could pay even at a high acceptance (`drafting_pays`). Plain decoding and prompt-lookup
    copies, which cost no drafter work, are then all `auto` does: never slower than plain
    decoding, and no drafter session is started."""
    curve = cached_curve(spec, loaded) if isinstance(spec, str) else None
    if not target_curve or not curve:
        return True  # not measured here: the policy finds out
    a = SETTINGS.hopeful_acceptance
    if drafting_pays(target_curve, curve[1], a):
        return True
    if progress:
        progress(f"auto: no draft of {loaded.name} ({loaded.path}, {curve[1] * 1e3:.1f} ms a pass) "
                 f"could pay on this target's measured curve even at acceptance {a}: decoding "
                 "plainly, with prompt-lookup copies (`--method` another method to draft anyway)")
    return False


class Decoder:
    """Lossless (speculative) text generation with a target model and an optional drafter."""

    def __init__(
        self,
        target,
        drafter=None,
        *,
        draft: DraftConfig | None = None,
        dtype="auto",
        drafter_dtype=None,
        device: str = "auto",
        tokenizer=None,
        drafter_tokenizer=None,
        progress=None,
        backend: str = "auto",
        drafter_backend: str | None = None,
        method: str | None = None,
        num_draft_tokens: int | None = None,
        draft_confidence: float | None = None,
        adaptive: bool | None = None,
        drafter_context: int | None = None,
        # the most sequences the target will score in one call (a server's batch): an `auto`
        # backend or dtype takes the path that serves that many best (models/auto.py `fastest`)
        rows: int = 1,
        # score every position of the target bit-identically whatever the call (models/exact.py):
        # greedy output identical to plain one-request decoding, in any method and batch;
        # "auto": where this machine measured that it costs little (models/exact_cost.py)
        exact: bool | str = "auto",
        # MiB of KV caches kept after requests for later prompts that start alike (the next
        # turn of a conversation reads only its new tokens; models/prefix.py); None: a share
        # of this machine's memory (`default_prefix_cache_mb`), 0: none kept
        prefix_cache_mb: float | None = None,
    ):
        if exact not in (True, False, "auto"):
            raise AnydraftError(f"exact must be True, False or 'auto', got {exact!r}")
        parse_dtype(dtype, allow_auto=True)
        check_backend(backend)
        if isinstance(target, str):  # a model object is used where it already is
            backend = backend_for(backend, dtype)  # an explicit dtype is a torch path
            check_target_device(backend, device)
        device = resolve_device(device)  # "auto": CUDA when there is a GPU
        if drafter_backend is not None:
            check_backend(drafter_backend)
        # a drafter dtype asked for is a torch path (the scout's backend choice too yields to it)
        if isinstance(drafter, str) and drafter_dtype not in (None, "auto"):
            drafter_backend = backend_for(drafter_backend or "auto", drafter_dtype, "drafter")
        if drafter == "auto":  # what `anydraft scout` chose for this target on this machine
            from .scouted import auto_drafter

            drafter, drafter_backend = auto_drafter(target, drafter_backend, progress)
        # the drafter's own fastest backend, whatever the target's (a torch target on a CPU
        # drafts fastest with a quantized llama.cpp drafter; a GPU target, with a torch one)
        drafter_backend = check_backend(drafter_backend or "auto")
        self.draft = override(draft or DraftConfig(), method=method,
                              num_draft_tokens=num_draft_tokens, draft_confidence=draft_confidence,
                              adaptive=adaptive, drafter_context=drafter_context)
        check_method(self.draft.method, has_drafter=drafter is not None)
        self.target = load(target, backend, tokenizer, dtype, device, progress, rows=rows)
        #: what ``exact="auto"`` chose and why (models/exact_cost.py `Choice`); None when given
        self.exact_choice = None
        if exact == "auto":
            self.choose_exact(target if isinstance(target, str) else None, rows, progress)
        elif exact:
            self.target.make_exact()
        self.drafter = None
        if drafter is not None:
            # the target's dtype, handed down, applies where the drafter runs on torch: it
            # leaves the drafter's backend to choose
            self.drafter = load(drafter, drafter_backend, drafter_tokenizer, drafter_dtype or dtype,
                                device, progress, role="drafter", dtype_given=drafter_dtype is not None)
            # sessions hand out CPU logits, so a model on llama.cpp (the CPU) or a null one pairs
            # with a torch model anywhere; two torch models on different devices are a mistake
            torch_only = {self.target.backend, self.drafter.backend} == {"torch"}
            if torch_only and self.drafter.device != self.target.device:
                raise AnydraftError(
                    f"drafter is on {self.drafter.device} but the target is on "
                    f"{self.target.device}: put both on the same device"
                )
        # what adaptive drafting learns about the pair, kept across requests (anydraft/planning/),
        # from the target's cost curve where this machine measured it (hardware/profile.py)
        profile = cached_curve(target, self.target) if isinstance(target, str) else None
        #: whether ``auto`` drafts with the drafter (`_drafting_pays`); a method named runs it anyway
        self.auto_drafts = self.drafter is not None and (
            not self.draft.adaptive or _drafting_pays(self.drafter, drafter, profile, progress))
        self.table = token_table(self.target.tokenizer)
        self.eos_ids = _eos_ids(self.target)
        self.estimates = Estimates(Costs(profile=profile or {}))
        self._method_factory = methods.factory(self)
        #: grammars compiled for the target (constraints/matcher.py), for requests with one
        self.grammars = Compiler(self.target.tokenizer, self.target.logits_width, self.eos_ids)
        self.set_prefix_cache(default_prefix_cache_mb() if prefix_cache_mb is None else prefix_cache_mb)

    # -- the prefix cache (models/prefix.py) -------------------------------------------------
    def set_prefix_cache(self, mb: float) -> None:
        """Keep up to ``mb`` MiB of the target's KV caches after requests (0: none), for the
        sessions of requests outside a batch and the rows of each batch made from now on
        (`new_rows`); what was kept beyond the new size is given up."""
        if mb < 0:
            raise AnydraftError(f"prefix_cache_mb must be 0 (off) or more, got {mb}")
        #: the budget in tokens of the target's KV cache
        self.prefix_cache_tokens = int(mb * 2**20) // max(1, self.target.kv_bytes_per_token)
        if not hasattr(self, "_sessions"):
            self._sessions = PrefixCache(0, close_session)
            self._sessions_lock = threading.Lock()
            self._rows: Rows | None = None  # `generate_batch`'s last rows, with what they kept
        with self._sessions_lock:
            self._sessions.tokens = self.prefix_cache_tokens
            while sum(k.cost for k in self._sessions.kept.values()) > self._sessions.tokens:
                self._sessions.give_up_oldest()
            self._rows = None

    def _session_for(self, ids: list[int]):
        """A session of the target's for a request outside a batch: a kept one that holds a
        prefix of ``ids``, rolled back to it, or a new one."""
        with self._sessions_lock:
            taken = self._sessions.take(ids, fresh_free=True)
        if taken is None:
            return self.target.new_session()
        session, shared = taken
        session.rollback(shared)
        return session

    def _keep_session(self, session, ids: list[int], usable: int) -> None:
        """`Generation.leave`'s ``keep`` for a session of its own."""
        if len(session) > len(ids):
            session.rollback(len(ids))
        with self._sessions_lock:
            kept = self._sessions.put(session, ids, usable, self.target.kept_cost(len(ids)))
        if not kept:
            close_session(session)

    # -- learned statistics (anydraft/learned.py) ------------------------------------------
    def save_stats(self, path) -> None:
        """Write what adaptive drafting learned about this pair (acceptance, costs) to the
        JSON file ``path``, atomically, for `load_stats` to seed another decoder with."""
        from . import learned

        learned.save(self, path)

    def load_stats(self, path) -> str:
        """Start from the statistics `save_stats` wrote to ``path``, as if this decoder had
        learned them itself (call it before generating: it replaces what was learned). Costs
        are seeded only on the machine and devices that measured them. Returns what was
        seeded, in words; a file for another pair, or a malformed one, raises AnydraftError."""
        from . import learned

        return learned.load(self, path)

    # -- prompts ---------------------------------------------------------------------------
    def prompt_ids(self, prompt, chat: bool = True, special_in_content: bool = False) -> list[int]:
        """Token ids of ``prompt`` (a string, or a list of chat messages when chat=True). In
        chat messages the text of a special token is text (chat.py), unless
        ``special_in_content``."""
        tok = self.target.tokenizer
        if isinstance(prompt, str):
            if not prompt.strip():
                raise AnydraftError("prompt is empty: pass some text")
            messages = [{"role": "user", "content": prompt}]
        elif chat and isinstance(prompt, list) and prompt:
            messages = prompt
        else:
            raise AnydraftError("prompt must be a non-empty string (or, with chat, a list of messages)")
        if chat:
            if not getattr(tok, "chat_template", None):
                raise AnydraftError(
                    f"{self.target.name} has no chat template: use chat=False (CLI: leave out --chat)"
                )
            ids = chat_ids(tok, messages, special_in_content)
        else:
            ids = tok.encode(prompt, add_special_tokens=True)
        return self.check_ids(ids)

    def check_ids(self, ids: list[int]) -> list[int]:
        """``ids``, a prompt's token ids, once they fit the target's context window and vocabulary."""
        tok = self.target.tokenizer
        limit = self.target.context_window
        if len(ids) >= limit:
            raise AnydraftError(
                f"prompt has {len(ids)} tokens but {self.target.name}'s context window is "
                f"{limit}: shorten the prompt"
            )
        # a tokenizer longer than the model's vocabulary (tokens added, embeddings not resized)
        # spells ids the model has no embedding for
        width = self.target.logits_width
        if ids and max(ids) >= width:
            bad = max(ids)
            raise AnydraftError(
                f"the prompt has token {tok.convert_ids_to_tokens(bad)!r} (id {bad}), but "
                f"{self.target.name} has only {width} token embeddings: its tokenizer "
                f"({len(tok)} tokens) is longer than the model's vocabulary; use the tokenizer "
                "the model was trained with, or leave that token out of the prompt"
            )
        return ids

    def choose_exact(self, spec: str | None, rows: int, progress=None) -> None:
        """``exact="auto"``: score exactly where this machine measured that it costs little on
        the target ``spec`` (None: a model object) scoring ``rows`` rows a call, the batch that
        will run (a server decides once ``--max-batch auto`` is resolved)."""
        self.exact_choice = choose_exact(spec, self.target, rows)
        if progress:
            progress(self.exact_choice.describe())
        if self.exact_choice.on:
            self.target.make_exact()

    # -- generation ------------------------------------------------------------------------
    def new_rows(self, max_rows: int) -> Rows:
        """Room for ``max_rows`` generations decoding together (`start`'s ``rows``): a batch of
        the target's, and of the drafter's where its backend batches (models/batch.py)."""
        drafter = self.drafter
        batches = drafter is not None and drafter.batches
        rows = Rows(self.target.new_batch(max_rows), drafter.new_batch(max_rows) if batches else None)
        rows.target.keep_tokens = self.prefix_cache_tokens
        return rows

    def start(self, prompt, max_new_tokens: int = 128, *, rows: Rows | None = None,
              cancel: Callable[[], str | None] | None = None, **options) -> Generation:
        """One request, checked and ready to run in a `Batch`: `generate`'s arguments, plus
        ``rows``, the batches (`new_rows`) whose rows the target and drafter run in (None:
        sessions of their own), and ``cancel``, asked between prompt chunks and before every
        step (a non-empty answer ends generation with that string as the finish reason). Bad
        input raises here."""
        return self.start_request(prompt, RequestOptions.of(max_new_tokens, **options), rows=rows,
                                  cancel=cancel)

    def start_request(self, prompt, request: RequestOptions, *, rows: Rows | None = None,
                      cancel: Callable[[], str | None] | None = None) -> Generation:
        """`start` with the options built (the entry point of `stream`, `generate_batch` and
        the server)."""
        ids = self.prompt_ids(prompt, request.chat, request.special_in_content)
        return self.start_ids(ids, request, rows=rows, cancel=cancel)

    def start_ids(self, ids: list[int], request: RequestOptions, *, rows: Rows | None = None,
                  cancel: Callable[[], str | None] | None = None,
                  eos_ids: frozenset[int] | None = None, generator=None) -> Generation:
        """`start_request` for a prompt given as token ids (`check_ids`), read as they are
        (``request.chat`` does not apply); ``eos_ids`` (None: the decoder's own) end
        generation, ``generator`` (None: one of ``request.sampling``'s) draws every random
        choice."""
        method = self.draft.method if request.method is None else request.method
        check_method(method, self.drafter is not None)
        if request.grammar is not None and method == "slrs":
            raise AnydraftError(GRAMMAR_METHODS)
        constraint = None if request.grammar is None else self.grammars.constraint(request.grammar)
        params = request.sampling
        params.check_vocabulary(self.target.logits_width)
        ids = self.check_ids(list(ids))
        if rows is None:
            session, keep = self._session_for(ids), self._keep_session if self.prefix_cache_tokens else None
        else:
            session, keep = RowView(rows.target, ids), RowView.keep
        try:
            state = DecodeState(session, ids, params, generator or params.generator(), Stats(),
                                drafter_rows=None if rows is None else rows.drafter,
                                top_logprobs=request.logprobs, constraint=constraint)
            text = TextAssembler(self.table.token_bytes, self.table.special_ids, request.stop)
            max_new = request.max_new_tokens
            made = self._method_factory(method, params, max_new, constrained=constraint is not None)
            return Generation(state, made, max_new,
                              self.eos_ids if eos_ids is None else eos_ids, text, Finish(), cancel, keep)
        except BaseException:  # the row goes back to the batch now, not when the GC finds it
            close_session(session)
            raise

    def generate(self, prompt, max_new_tokens: int = 128, **options) -> GenerationOutput:
        """Generate a completion of ``prompt`` (a string, or with ``chat`` a list of messages).
        ``options``: `RequestOptions`' fields (``sampling``, ``chat``, ``stop``, ``method``,
        ``logprobs``, ``special_in_content``) and the sampling shortcuts ``temperature``,
        ``top_k``, ``top_p``, ``min_p``, ``seed``, ``logit_bias`` (`RequestOptions.of`)."""
        stream = self.stream(prompt, max_new_tokens, **options)
        for _ in stream:
            pass
        return stream.output

    def generate_batch(self, prompts: Sequence, max_new_tokens: int = 128, *,
                       max_batch: int | None = None, n: int = 1,
                       **options) -> list[GenerationOutput]:
        """`generate` for each of ``prompts`` (the same ``options`` for all), decoded together: each
        step scores every unfinished prompt's candidates in one target call where the target's
        backend batches (models/batch.py; others run the rows one after another). At most
        ``max_batch`` prompts (None: all) decode at once; one that finishes leaves at once and
        the next joins. Each output is what `generate` gives for its
        prompt alone: greedy token for token with a float32 torch target (a bfloat16 or
        llama.cpp target can round a near tie differently in a batch), sampling in
        distribution (and draw for draw at a fixed draft length).

        ``n``: completions of each prompt, rows of the same batch, each exactly distributed;
        the outputs are prompt-major (``outputs[i * n + j]``: prompt i's completion j). With a
        seed, completion j of each prompt is a stream of its own (`SamplingParams.for_choice`)."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise AnydraftError("prompts must be a non-empty list of prompts")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise AnydraftError(f"n must be a positive integer, got {n!r}")
        runs = [(prompt, j) for prompt in prompts for j in range(n)]
        if max_batch is None:
            max_batch = len(runs)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise AnydraftError(f"max_batch must be a positive integer, got {max_batch!r}")
        request = RequestOptions.of(max_new_tokens, **options)
        for prompt in prompts:  # every prompt checked before any is decoded
            self.prompt_ids(prompt, request.chat, request.special_in_content)
        rows = self._batch_rows(min(max_batch, len(runs)))
        batch, generations = Batch(), []
        while True:
            while len(batch) < max_batch and len(generations) < len(runs):
                prompt, j = runs[len(generations)]
                choice = replace(request, sampling=request.sampling.for_choice(j))
                generations.append(self.start_request(prompt, choice, rows=rows))
                batch.join(generations[-1])
            if not batch:
                if self.prefix_cache_tokens:  # its kept rows, for the next call
                    with self._sessions_lock:
                        self._rows = rows
                return [g.result()[1] for g in generations]
            batch.run_once()

    def _batch_rows(self, wanted: int) -> Rows:
        """Rows for `generate_batch`: the last call's, with the rows it kept (models/prefix.py),
        where they are enough and no other thread runs them; else new ones."""
        with self._sessions_lock:
            rows, self._rows = self._rows, None
        if rows is not None and rows.target.max_rows >= wanted:
            return rows
        return self.new_rows(wanted)

    def stream(self, prompt, max_new_tokens: int = 128, *,
               cancel: Callable[[], str | None] | None = None, **options) -> TextStream:
        """Text deltas as tokens are committed (never splitting a UTF-8 character); the
        arguments are `generate`'s.

        Bad input raises here, before iteration. Once iterated to the end, the returned
        stream's ``.output`` holds the `GenerationOutput` (token ids, stats, finish reason).
        ``cancel`` (for servers) is asked between prompt chunks and before every step; a
        non-empty answer ends the stream with that string as the finish reason.
        """
        return TextStream(self.start(prompt, max_new_tokens, cancel=cancel, **options))


class TextStream:
    """Iterate for text deltas; ``output`` is the `GenerationOutput` once iteration ends."""

    def __init__(self, generation: Generation):
        self.generation = generation
        self.output: GenerationOutput | None = None

    @property
    def prompt_tokens(self) -> int:
        """Length of the tokenized prompt (known before iteration starts)."""
        return self.generation.prompt_tokens

    def __iter__(self) -> Iterator[str]:
        batch = Batch()
        batch.join(self.generation)
        while batch:
            batch.run_once()
            if delta := self.generation.delta():
                yield delta
        tail, self.output = self.generation.result()
        if tail:
            yield tail
