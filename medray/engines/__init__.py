"""Every model call goes through the one Engine protocol (see base.py)."""

from medray.engines.base import Engine, Generation, OptionScore

__all__ = ["Engine", "Generation", "OptionScore"]
