"""Errors a user can cause. Each message names the fix."""


class AnydraftError(ValueError):
    """Bad input or environment: unknown model, invalid settings, prompt too long, ..."""
