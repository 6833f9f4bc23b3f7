"""What this machine is and how fast each way of running a model is on it: measured, cached
per machine and model, never assumed (`anydraft doctor` prints it)."""

from .machine import Machine, this_machine

__all__ = ["Machine", "this_machine"]
