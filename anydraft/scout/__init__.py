"""`anydraft scout`: which drafter, backend and method make a target fastest on this machine.

Measuring every candidate end to end against plain decoding takes long; the bound of
speculative decoding (Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", ICML 2023; for drafters of another vocabulary Timor et al., "Accelerating LLM
Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies", ICML
2025) predicts a speedup from a few numbers a short run measures: the acceptance a, the
drafter's cost c, the translation overhead, and the target's cost curve. The scout measures
those for every candidate (`measure.py`), predicts each one's speedup at its best draft
length, confirms the best three beside plain decoding, and saves the winner for
``Decoder(target=T, drafter="auto")`` and ``anydraft serve --drafter auto`` (anydraft/scouted.py,
below the decoder that reads it).
"""
