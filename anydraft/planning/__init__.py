"""Every decision about a decoding step, for one row or for the rows sharing a target call;
decoding/step.py carries them out and nothing else.

- settings.py: `Settings`, every tuning constant once, with why it has its value.
- estimates.py: what a pair's steps cost and earn (`Costs`, `Acceptance`), learnt online.
- cost.py: the one cost model (`terms`, `rate`) and the rules it prices for one row: the best
  draft length, when to probe, when and how much of a drafter's backlog to read.
- policy.py: one row's `Policy` (`choose` a `Choice`, `observe` a `Measured` step) and
  `allocate`, the joint draft lengths of the rows of one call.
- call.py: one step's `Call`s (`calls`), `plan` (every row's choice, the rules between the rows
  of a call), `prefill` (joining prompts read inside the calls) and `learn`.

Light at import time (the settings are read by the command line): import the modules.
"""
