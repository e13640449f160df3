"""The QA routes' work, shared by /v1/qa (one question) and /v1/qa/batch (one patient's
questions over their shared record): the long-context strategy of medray/prompts plans each
question's prompts over the record tokenised once, and the prompts go to the LLM replica
together, as few multi-prompt completion requests as max_batch allows (one for a patient's
trimmed questions), so a batch costs the ingress and the replica one round trip instead of
one per question. Each question's answer is the one /v1/qa gives it alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from medray.engines.base import Generation
from medray.serve.errors import APIError
from medray.serve.relay import Target
from medray.serve.schemas import QABase, QAResponse


def request_groups(sizes: Sequence[int], most: int) -> list[list[int]]:
    """Questions (by their prompt counts `sizes`, each at most `most`) packed in order into
    requests of at most `most` prompts; each group lists its questions' indices."""
    groups: list[list[int]] = []
    used = most
    for i, size in enumerate(sizes):
        if used + size > most:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += size
    return groups


class QAAnswers:
    """QAIngress's QA work (a mixin: QAIngress provides cfg, counts and the LLM calls)."""

    cfg: Any
    counts: Any

    async def _answers(self, body: QABase, questions: Sequence[str],
                       where: str | None = None) -> list[QAResponse]:
        """Answers to `questions` over `body.context` with the body's prompt options.
        `where`: the request's list field (its index goes in error params), None for a
        single question."""
        from medray.prompts.strategies import finish_strategy, plan_strategy
        from medray.prompts.tokens import BudgetError, encode_context

        b: Any = body
        ingress: Any = self  # the route plumbing is QAIngress's
        cfg = self.cfg
        target: Target = ingress._target(b.model, b.adapter)
        asked = {"format": b.prompt_format, "context_tokens": b.context_tokens,
                 "strategy": b.strategy, "max_new_tokens": b.max_new_tokens}
        spec = ingress._prompt(target).model_copy(
            update={k: v for k, v in asked.items() if v is not None})
        tokenizer = ingress._tokenizer(target.source)
        context_ids = encode_context(tokenizer, b.context)  # once for every question
        plans = []
        for i, question in enumerate(questions):
            field = f"{where}.{i}" if where else None
            try:
                plan = plan_strategy(tokenizer, question, b.context, spec, context_ids)
            except BudgetError as err:  # the question alone does not fit context_tokens
                raise APIError(400, "invalid_request_error", f"context length: "
                               f"{field + ': ' if field else ''}{err}",
                               field or "context_tokens") from None
            # context_tokens <= the context limit (schema), so every planned prompt fits the
            # window; chunks answers each piece: at most max_batch of them per question.
            if len(plan.prompts) > cfg.max_batch:
                raise APIError(400, "invalid_request_error", (
                    f"context length: chunks of context_tokens {spec.context_tokens} split "
                    f"it into {len(plan.prompts)} prompts; at most max_batch "
                    f"({cfg.max_batch})"), "context")
            plans.append(plan)
        groups = request_groups([len(p.prompts) for p in plans], cfg.max_batch)
        replies = await asyncio.gather(*(ingress.generate_ids(
            target, [p for i in group for p in plans[i].prompts], spec.max_new_tokens)
            for group in groups))
        gens: list[list[Generation]] = []
        for group, reply in zip(groups, replies, strict=True):
            start = 0
            for i in group:
                gens.append(reply[start:start + len(plans[i].prompts)])
                start += len(plans[i].prompts)
        self.counts["qa"] += len(questions)  # questions answered, one by one or in batches
        out = []
        for plan, got in zip(plans, gens, strict=True):
            res = finish_strategy(plan, got)
            out.append(QAResponse(
                answer=res.answer, logprob=res.logprob, prompt_tokens=res.prompt_tokens,
                strategy=res.strategy, model=target.model, adapter=target.adapter, prompt=spec,
                prompt_ids=[g.prompt_ids for g in got] if b.return_prompt_ids else None))
        return out
