"""The machine anydraft runs on and what is measured on it, below the models: what this machine
is (machine.py; huge pages, hugepages.py) and how long a model's calls take here (profile.py:
cost curves measured from the sessions it is handed, cached per machine, never assumed).
Which paths a model has and which one ``auto`` keeps is models/auto.py's; `anydraft doctor`
prints it all."""

from .machine import Machine, this_machine

__all__ = ["Machine", "this_machine"]
