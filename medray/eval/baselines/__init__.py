"""Trivial baselines from the papers: random token selector, majority answer, MCQ guessing."""

from medray.eval.baselines.generative import (
    majority_answer,
    majority_predictions,
    random_token_predictions,
)
from medray.eval.baselines.mcq import (
    majority_letters,
    mcq_majority_predictions,
    mcq_random_predictions,
)

__all__ = [
    "majority_answer",
    "majority_predictions",
    "random_token_predictions",
    "majority_letters",
    "mcq_majority_predictions",
    "mcq_random_predictions",
]
