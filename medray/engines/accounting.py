"""Token and cost accounting per run, plus the concurrency cap and rate limit of API engines.

PRICES: USD per 1M tokens (input, output), public list prices AS OF 2025-10 (standard tier,
no batch or cache discounts). They only feed estimates and run summaries; check the
providers' pricing pages before budgeting. Unknown models report cost None, never 0.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

PRICES_AS_OF = "2025-10"
PRICES: dict[str, tuple[float, float]] = {
    # OpenAI
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5": (1.25, 10.00),
    # Anthropic
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4-1": (15.00, 75.00),
}

CHARS_PER_TOKEN = 4.0  # dry-run estimate only: no tokenizer of the provider is available offline


def price_for(model: str) -> tuple[float, float] | None:
    """Longest price-table prefix of the model name ("claude-3-5-haiku-20241022" ->
    "claude-3-5-haiku"), so dated snapshots share their family's price."""
    best = None
    for name, price in PRICES.items():
        if model == name or model.startswith(name + "-"):
            if best is None or len(name) > len(best[0]):
                best = (name, price)
    return best[1] if best else None


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float | None:
    price = price_for(model)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000


def estimate_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))


@dataclass
class Usage:
    """Thread-safe running totals for one engine in one run; cached answers cost nothing."""

    model: str
    calls: int = 0
    cached: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, input_tokens: int, output_tokens: int, cached: bool) -> None:
        with self._lock:
            if cached:
                self.cached += 1
                return
            self.calls += 1
            self.input_tokens += int(input_tokens or 0)
            self.output_tokens += int(output_tokens or 0)

    def summary(self) -> dict:
        cost = cost_usd(self.model, self.input_tokens, self.output_tokens)
        return {
            "model": self.model,
            "calls": self.calls,
            "cached": self.cached,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": None if cost is None else round(cost, 6),
            "prices_as_of": PRICES_AS_OF,
            "cost_note": "list price per 1M tokens x provider-reported usage of new calls",
        }


class RateLimiter:
    """At most `per_minute` call starts per rolling minute (evenly spaced); None = no limit.
    The concurrency cap is the engine's thread-pool size; this bounds the start rate."""

    def __init__(self, per_minute: float | None) -> None:
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            time.sleep(start - now)
