"""`--baseline hf`: Hugging Face transformers' own assisted generation on the same pair.

Same tokenizer: plain assisted generation (`assistant_model=`). Different tokenizers:
`assistant_model=, tokenizer=, assistant_tokenizer=`, which is Universal Assisted Generation
for greedy and its token-intersection sampler (TLI) for sampling. Settings are made explicit
(k drafts per round, constant schedule, no confidence cut, no repetition penalty) so that the
model's generation_config cannot change the comparison.
"""

from __future__ import annotations

import copy
import time

from ..bridge import same_tokenizer


def _vocab_size(model) -> int:
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(config.vocab_size)


class HFAssisted:
    """One target + one assistant; ``generate(ids, ...)`` -> (new token ids, seconds)."""

    def __init__(self, target_model, target_tok, drafter_model, drafter_tok,
                 num_draft_tokens: int, sampling: bool):
        self.target_model, self.target_tok = target_model, target_tok
        self.drafter_tok = drafter_tok
        self.num_draft_tokens = num_draft_tokens
        self.same = same_tokenizer(target_tok, drafter_tok)
        same_width = _vocab_size(target_model) == _vocab_size(drafter_model)
        # transformers picks its path by comparing vocab_size: it refuses tokenizers when the
        # sizes match and needs them when they differ
        self.pass_tokenizers = not same_width
        self.skip_reason = None
        if not self.same and same_width:
            self.skip_reason = (
                "transformers decides 'same tokenizer' by vocab_size, which is equal here although "
                "the vocabularies differ: its assisted generation cannot run on this pair")
        # its sampling path for different tokenizers prunes the assistant's lm_head in place:
        # give it a private copy so our own runs keep the intact drafter
        if self.pass_tokenizers and sampling:
            drafter_model = copy.deepcopy(drafter_model)
        self.drafter_model = drafter_model
        gc = self.drafter_model.generation_config
        gc.num_assistant_tokens = num_draft_tokens
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0

    @property
    def mode(self) -> str:
        if self.skip_reason:
            return "unsupported"
        if not self.pass_tokenizers:
            return "assisted (same tokenizer)"
        return "universal assisted (tokenizer + assistant_tokenizer)"

    def generate(self, ids: list[int], max_new_tokens: int, params, eos_ids) -> tuple[list[int], float, None]:
        """The new tokens, the seconds they took, and None: transformers does not time the
        prompt read apart."""
        import torch
        from transformers import GenerationConfig

        assert self.skip_reason is None, self.skip_reason
        eos = sorted(eos_ids)
        pad = self.target_tok.pad_token_id
        settings = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=eos,
                        pad_token_id=eos[0] if pad is None else pad, repetition_penalty=1.0,
                        do_sample=not params.greedy, num_assistant_tokens=self.num_draft_tokens,
                        num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        if not params.greedy:
            settings.update(temperature=params.temperature, top_k=params.top_k or 0,
                            top_p=params.top_p, min_p=params.min_p or None)
            if params.seed is not None:
                torch.manual_seed(params.seed)
        kwargs = dict(assistant_model=self.drafter_model)
        if self.pass_tokenizers:
            kwargs.update(tokenizer=self.target_tok, assistant_tokenizer=self.drafter_tok)
        device = next(self.target_model.parameters()).device
        input_ids = torch.tensor([ids], device=device)
        start = time.perf_counter()
        with torch.no_grad():
            out = self.target_model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids),
                generation_config=GenerationConfig(**settings), **kwargs)
        seconds = time.perf_counter() - start
        new = [int(t) for t in out[0, len(ids):]]
        # a finished sequence is not padded at batch size 1, but be safe: cut after an EOS
        for i, t in enumerate(new):
            if t in eos_ids:
                new = new[: i + 1]
                break
        return new, seconds, None
