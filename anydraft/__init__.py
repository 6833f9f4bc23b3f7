"""anydraft: lossless speculative decoding with any drafter, whatever its tokenizer."""

from .config import DraftConfig
from .errors import AnydraftError
from .sampling import SamplingParams

__all__ = ["AnydraftError", "Decoder", "DraftConfig", "GenerationOutput", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`Decoder` and `GenerationOutput` load torch: imported on first use, so that the command
    line (`anydraft --help`, `anydraft models list`) starts without it."""
    if name in ("Decoder", "GenerationOutput"):
        from . import decoder

        return getattr(decoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
