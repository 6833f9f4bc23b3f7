"""`anydraft bench`: every method side by side on one target, against plain decoding,
the transformers baseline and the analytic bound. See `anydraft bench --help`.

Layout: `bound` (the pure formula S(a, k, c)), `datasets` (prompt sets), `runner` (the timed,
interleaved runs -> rows), `hf_baseline` (transformers' assisted generation), `report`
(results.json, summary.md), `plots` (PNGs), `cli` (the subcommand).
"""

from .bound import cost_ratio, per_token_acceptance, speedup_bound

__all__ = ["cost_ratio", "per_token_acceptance", "speedup_bound"]
