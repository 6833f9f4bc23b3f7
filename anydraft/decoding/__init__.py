from .loop import DecodeState, Finish, Generation, decode, decode_batch
from .stats import Stats
from .text import TextAssembler

__all__ = ["DecodeState", "Finish", "Generation", "Stats", "TextAssembler", "decode", "decode_batch"]
