"""`anydraft doctor` and the checks of a machine: commands at the top, over everything below.

- report.py: `anydraft doctor`: this machine, each model's measured cost curves on every path,
  what ``auto`` chooses from them, and what exact scoring costs.
- batched.py: `anydraft doctor --batch`: a target's batched calls against its one-sequence curve.
- device_check.py: the GPU check's sections (scripts/gpu_check.sh runs
  ``python -m anydraft.doctor.device_check``).
"""
