"""Every tuning constant of the planning, each once, with why it has its value and where that
was measured. None of them changes what is sampled (every method is lossless for any plan):
they change only how fast.

Code reads them from `SETTINGS` at the time of use, so a test may patch one attribute
(``monkeypatch.setattr(SETTINGS, "evidence", 0.0)``) and every rule sees it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Settings:
    # -- what the estimates remember (planning/estimates.py) -----------------------------------
    # weight kept by older steps per new observation: ~10 steps of memory, fast enough to follow
    # a request's change of topic (docs/adaptive-drafting.md, "the policy today")
    forget: float = 0.9
    # weight kept by the drafter's estimates per step that does not run it, so a probe after a
    # transient slowdown replaces stale numbers (docs/adaptive-drafting.md, rule 4)
    fade: float = 0.95
    # a_i before position i was ever reached: a neutral guess replaced within a few steps
    prior_acceptance: float = 0.5
    # before any backlog read was measured, a backlog token is priced at this share of a drafter
    # pass (one pass reads many tokens for little more than one; replaced by the first read timed)
    first_read_share: float = 1 / 16
    # a backlog this short (the last step's own tokens) rides along with the first drafter pass
    # for free: pricing it as a read made a drafting step look dear
    free_read: int = 2
    # a fitted cost line never reaches zero (a zero-cost step would win every comparison)
    min_seconds: float = 1e-6
    # the target cost curve's straight line counts as this many calls at each size seen: a size
    # seen once sits halfway between its time and the line, one seen often at its own
    # (docs/adaptive-drafting.md, rule 9: llama.cpp's bent curve)
    shrink: float = 1.0
    # a cost curve measured on this machine (hardware/profile.py) counts as this many of the
    # pair's own target calls, all its sizes together: it shapes the first steps and has faded
    # after ~20 calls (docs/adaptive-drafting.md, "the policy today")
    profile_weight: float = 1.0

    # a step with candidates is priced as committing this share fewer tokens than expected
    # (cost.py `terms`): the choice among estimates that all carry noise favours the ones that
    # came out high, so a draft predicted to win by a hair loses on average. Qwen2.5-1.5B <-
    # SmolLM2 on llama.cpp on a 2-core Zen 5 (verifying 2 tokens ~1.6-1.9 plain steps): drafts
    # predicted to win by a few percent cost auto 3-16% against plain decoding in math and
    # coding (docs/llama-server.md); where drafting pays (GPUs, flat curves) it pays by far more
    min_gain: float = 0.05

    # -- when the drafter is re-measured (planning/cost.py `probe_due`) ------------------------
    # what a probe may waste, as a share of the steps without the drafter before it: probes came
    # rarely enough and still revived a drafter stopped for good (docs/adaptive-drafting.md, rule 4)
    probe_share: float = 0.02
    # backlog tokens a probe reads, and the fewest an adaptive draft reads: reading 64 first cost
    # more than a probe's 5 passes (docs/adaptive-drafting.md, rule 5)
    probe_read: int = 16

    # -- the rows of one shared target call (planning/call.py) ---------------------------------
    # observations of a pair's first draft position before more than one row of a call drafts
    # on them: one lucky probe had every row of a call draft long at once, steps several times
    # a plain one (docs/benchmarks-history.md, batching)
    evidence: float = 3.0
    # a joining prompt's read may make the decoding rows' call cost this much more than a
    # one-token call: p99 inter-token latency under load (docs/benchmarks-history.md, batching)
    batch_latency: float = 1.5
    # the fewest prompt tokens a batch's call reads for joining sequences, however full it is
    # (`anydraft serve --min-read`): a 256-token prompt joins within 16 steps
    # (docs/benchmarks-history.md, serve-min-read)
    min_prefill: int = 16

    # `auto` loads no drafter where even this acceptance per token could not make any draft pay on
    # the measured cost curves (`cost.drafting_pays`): the best seen on held-out code on a CPU was
    # 0.71-0.89 per token (Qwen2.5-1.5B <- SmolLM2), so a drafter that could ever pay is kept
    hopeful_acceptance: float = 0.9

    # the most tokens a grammar forces that one step offers after its candidates
    # (decoding/step.py `_with_forced`): a JSON schema's key with its quotes is 1-4 tokens of
    # Qwen2.5's vocabulary; the bound keeps a long forced literal (a const string) from making
    # one call score hundreds of tokens on a steep cost curve
    most_forced: int = 16

    # -- settings a request or a server starts from --------------------------------------------
    # the most backlog tokens (the prompt, at first) the drafter reads before drafting
    # (`DraftConfig.drafter_context`): a long prompt read whole kept a slow-reading drafter idle,
    # and the prompt's end informs a draft most (docs/adaptive-drafting.md, rules 2 and 6)
    drafter_context: int = 64
    # drafting steps of each candidate method before ``auto`` compares them (methods/pairing.py
    # `Pairing.fastest`): Qwen-0.5B <- SmolLM2 settled on slrs within it
    # (docs/adaptive-drafting.md, "the policy today")
    trial_steps: int = 24
    # the most rows `--max-batch auto` gives a server worker (server/workers.py); the knee of the
    # measured curves lies below it on the machines measured (docs/server.md)
    max_auto_batch: int = 16


SETTINGS = Settings()

# tokens read per call when the caller can cancel a long read (a prompt): small enough that a
# long prompt on a CPU is abandoned within a fraction of a second, large enough to cost no speed.
# The most a call reads for joining prompts (call.py `prefill_budget`), and the pieces a session
# reads a prompt in (models/session.py `read_in_chunks`). A constant, not a `Settings` field: an
# exact batch reads a prompt in the pieces a request alone does (models/exact.py `reads`), so no
# test may change it for one side only
PREFILL_CHUNK = 256
