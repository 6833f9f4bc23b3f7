from .loop import Batch, DecodeState, Finish, Generation, GenerationOutput, decode_batch
from .stats import Stats
from .text import TextAssembler

__all__ = ["Batch", "DecodeState", "Finish", "Generation", "GenerationOutput", "Stats", "TextAssembler",
           "decode_batch"]
