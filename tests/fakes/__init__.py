"""Local fake API servers for tests (127.0.0.1, free port, in a thread)."""

from .local import ScriptedEngine
from .servers import FakeAnthropic, FakeOpenAI, FakeServer

__all__ = ["FakeAnthropic", "FakeOpenAI", "FakeServer", "ScriptedEngine"]
