"""A scripted local (text-only) engine: the Engine protocol without a model, for unit tests
of the evaluation loop. `answer(prompt) -> str`; counts calls; can fail after N prompts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from medray.engines.base import Generation, OptionScore


class ScriptedEngine:
    name = "scripted"
    supports_images = False

    def __init__(self, answer: Callable[[str], str], model: str = "scripted-1",
                 fail_after: int | None = None,
                 option_logprob: Callable[[str, str], float] | None = None) -> None:
        self.answer, self.model, self.adapter = answer, model, None
        self.fail_after = fail_after
        self.option_logprob = option_logprob or (lambda prompt, cont: -float(len(cont)))
        self.prompts: list[str] = []
        self.max_tokens: list[int] = []
        self.scored = 0

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int,
                 temperature: float = 0.0) -> list[Generation]:
        out = []
        for p in prompts:
            if self.fail_after is not None and len(self.prompts) >= self.fail_after:
                raise RuntimeError("scripted crash")
            self.prompts.append(p)
            self.max_tokens.append(max_new_tokens)
            text = self.answer(p)
            out.append(Generation(text=text, token_ids=[1] * max(1, len(text.split())),
                                  logprobs=[-0.5] * max(1, len(text.split())),
                                  prompt_tokens=len(p.split())))
        return out

    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        self.scored += 1
        return [OptionScore(logprob=self.option_logprob(prompt, c), n_tokens=len(c.split()),
                            n_chars=len(c)) for c in continuations]
