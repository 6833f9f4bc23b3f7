from .loop import DecodeState, Finish, decode
from .stats import Stats
from .text import TextAssembler

__all__ = ["DecodeState", "Finish", "Stats", "TextAssembler", "decode"]
