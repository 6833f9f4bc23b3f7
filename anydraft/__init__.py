"""anydraft: lossless speculative decoding with any drafter, whatever its tokenizer."""

from .decoder import Decoder, GenerationOutput
from .errors import AnydraftError
from .sampling import SamplingParams

__all__ = ["AnydraftError", "Decoder", "GenerationOutput", "SamplingParams"]
__version__ = "0.1.0"
