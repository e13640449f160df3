"""One engine turning prepared examples into prediction rows: the per-item work of every
evaluation, the same in an evaluation actor (medray/eval/actors.py) and in-process.

How each engine kind is asked:
- generative, Serve: the QA routes (`/v1/qa/batch`: a patient's questions in one call),
  which trim as training did;
- generative, local model (vllm, hf): the prompt strategies of medray/prompts/strategies.py;
- generative, chat API: the whole epicrisis (the papers' API baselines did no trimming);
- multiple choice: the prompt of medray/prompts/text.py (Serve through its `/v1/mcq` route with
  the item's dataset, chat APIs as system/user pair with the item's images, a local
  vision-language model with the item's images placed by its chat template);
- baselines: the rows `medray baseline` writes for the split, served per item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from medray.eval import mcq
from medray.eval.config import EvalConfig
from medray.eval.runio import prediction_row
from medray.prompts.spec import PromptSpec
from medray.prompts.text import (
    asked_kind,
    example_dict,
    meta_dict,
    prompt_text,
    protocol_budget,
    render,
)


def baseline_rows(cfg: EvalConfig, data: Any) -> list[dict]:
    """Whole-split baseline rows, computed exactly as `medray baseline` does (one seeded
    generator walks the split in table order)."""
    from medray.eval import baselines as bl

    spec = cfg.engine
    examples = data.split(cfg.split)
    if data.kind == "generative":
        if spec.baseline == "majority":
            return bl.majority_predictions(examples, bl.majority_answer(data.split("train")))
        if spec.baseline == "random-token":
            return bl.random_token_predictions(examples, data.context, spec.tokens,
                                               spec.seed, spec.tokenizer)
    else:
        if spec.baseline == "majority":
            return bl.mcq_majority_predictions(examples, data.split("train"))
        if spec.baseline == "random":
            return bl.mcq_random_predictions(examples, spec.seed)
    raise ValueError(f"baseline {spec.baseline!r} does not apply to {data.kind} data")


class Predictor:
    """Holds one engine (or a baseline's rows) for one run."""

    def __init__(self, cfg: EvalConfig, data: Any, *, engine: Any = None,
                 shots: Mapping[str, Sequence[dict]] | None = None, loglik: bool = False,
                 max_new_tokens: int | None = None, **engine_kwargs: Any) -> None:
        self.cfg, self.data = cfg, data
        self.spec = cfg.engine
        self.prompt = cfg.prompt or PromptSpec()  # resolved by the planner
        self.max_new_tokens = max_new_tokens  # configured; else each dataset's budget
        self.shots = shots or {}
        self.loglik = loglik
        self._baseline: dict[str, dict] = {}
        self.engine = engine
        if self.spec.kind == "baseline":
            self._baseline = {str(r["id"]): r for r in baseline_rows(cfg, data)}
        elif engine is None:
            from medray.engines.registry import build_engine

            self.engine = build_engine(self.spec, **engine_kwargs)

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            # A local vLLM engine left to interpreter exit can abort in its messaging layer
            # (exit 134 after the results were written): stop it while the process is whole.
            self.engine.close()

    # ----------------------------------------------------------------------- rows
    def _row(self, ex: Mapping[str, Any], prediction: str, **fields: Any) -> dict[str, Any]:
        return prediction_row(str(ex["id"]), prediction, engine=self.spec.kind,
                              model=self.spec.label, adapter=self.spec.adapter, **fields)

    def predict(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Rows for `examples` (prepared rows), in order."""
        if self.spec.kind == "baseline":
            return [dict(self._baseline[str(ex["id"])]) for ex in examples]
        # Serve has QA and MCQ routes that prompt on the server with the same code.
        if self.data.kind == "generative":
            if hasattr(self.engine, "qa_batch"):
                return self._serve_qa_batch(examples)
            if self.spec.external or not hasattr(self.engine, "tokenizer"):
                return self._whole_context(examples)
            return self._strategies(examples)
        items = [example_dict(ex) for ex in examples]
        if hasattr(self.engine, "mcq"):
            return [self._serve_mcq(ex) for ex in items]
        return self._mcq(items)

    # ----------------------------------------------------------------- generative
    def _generative_budget(self) -> int:
        return self.prompt.new_tokens(self.max_new_tokens)

    def _qa_options(self) -> dict[str, Any]:
        # Every prompt setting is sent: Serve then prompts exactly as this run says (the
        # served model's own spec unless the eval config overrides it).
        p = self.prompt
        return {"prompt_format": p.format, "context_tokens": p.context_tokens,
                "strategy": p.strategy, "max_new_tokens": self._generative_budget()}

    def _qa_row(self, ex: Mapping[str, Any], res: Mapping[str, Any]) -> dict[str, Any]:
        p = self.prompt
        return self._row(ex, res["answer"], logprob=res["logprob"], prompt_format=p.format,
                         context_tokens=p.context_tokens, strategy=p.strategy,
                         prompt_tokens=res.get("prompt_tokens"))

    def _serve_qa_batch(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Each patient's questions in one call (their record sent and tokenised once);
        the rows in the order of `examples`."""
        by_patient: dict[Any, list[int]] = {}
        for i, ex in enumerate(examples):
            by_patient.setdefault(ex["context_id"], []).append(i)
        rows: list[Any] = [None] * len(examples)
        for context_id, idx in by_patient.items():
            answers = self.engine.qa_batch([examples[i]["question"] for i in idx],
                                           self.data.context(context_id), **self._qa_options())
            for i, res in zip(idx, answers, strict=True):
                rows[i] = self._qa_row(examples[i], res)
        return rows

    def _strategies(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The examples' prompts (per the long-context strategy) in one engine call."""
        from medray.prompts.strategies import run_strategies

        p, budget = self.prompt, self._generative_budget()
        if budget != p.max_new_tokens:
            p = p.model_copy(update={"max_new_tokens": budget})
        generate = getattr(self.engine, "generate_ids", self.engine.generate)
        results = run_strategies(lambda prompts: generate(prompts, max_new_tokens=budget),
                                 self.engine.tokenizer,
                                 [(ex["question"], self.data.context(ex["context_id"]))
                                  for ex in examples], p)
        return [self._row(ex, res.answer, raw_output=res.raw, logprob=res.logprob,
                          n_tokens=res.n_tokens, prompt_format=p.format,
                          context_tokens=p.context_tokens, strategy=p.strategy,
                          prompt_tokens=res.prompt_tokens)
                for ex, res in zip(examples, results, strict=True)]

    def _whole_context(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        from medray.prompts.text import medqaro_prompt

        prompts = [medqaro_prompt(ex["question"], self.data.context(ex["context_id"]))
                   for ex in examples]
        gens = self.engine.generate(prompts, max_new_tokens=self._generative_budget())
        return [self._generation_row(ex, gen.text.strip(), gen, True, "qea:full")
                for ex, gen in zip(examples, gens, strict=True)]

    def _generation_row(self, ex: Mapping[str, Any], prediction: str, gen: Any,
                        conforming: bool, prompt_format: str, **extra: Any) -> dict[str, Any]:
        usage = {"prompt_tokens": gen.prompt_tokens,
                 "cached": bool(getattr(gen, "cached", False))}
        return self._row(ex, prediction, raw_output=gen.raw if gen.raw is not None else gen.text,
                         conforming=conforming, logprob=gen.mean_logprob,
                         n_tokens=getattr(gen, "output_tokens", 0) or gen.n_tokens,
                         prompt_format=prompt_format, **usage, **extra)

    # ------------------------------------------------------------ multiple choice
    def _mcq_fields(self, ex: dict, n_images_sent: int = 0) -> dict[str, Any]:
        asked = asked_kind(ex, self.cfg.group_as_multiple)
        return {"kind": ex["kind"], "language": ex.get("language"),
                "n_images_sent": n_images_sent,
                "prompt_format": f"mcq:{ex['dataset']}:{ex['kind']}:asked-{asked}:"
                                 f"{self.prompt.shots}shot"}

    def _budget(self, ex: dict) -> int:
        return self.prompt.new_tokens(self.max_new_tokens,
                                      protocol_budget(ex, self.cfg.group_as_multiple))

    def _serve_mcq(self, ex: dict) -> dict[str, Any]:
        res = self.engine.mcq(ex, self.shots.get(str(ex["kind"]), ()),
                              max_new_tokens=self.max_new_tokens)
        text, _, _ = mcq.read_answer(res["raw"], ex)  # the route read it the same way
        # The engine sends every image of the item (image items reach it only when the
        # served model takes images: medray.eval.plan).
        return self._row(ex, text, raw_output=res["raw"], conforming=res["conforming"],
                         labels=list(res["answer"]),
                         **self._mcq_fields(ex, len(ex.get("images") or ())))

    def _mcq(self, items: list[dict]) -> list[dict[str, Any]]:
        is_api = hasattr(self.engine, "chat")
        # A local vision-language model: each item's images go with its prompt.
        vision = not is_api and bool(getattr(self.engine, "supports_images", False))
        prompts = [render(ex, self.shots, self.cfg.group_as_multiple) for ex in items]
        gens: list[Any] = [None] * len(items)
        by_budget: dict[int, list[int]] = {}  # one call per output budget: each is minimal
        for i, ex in enumerate(items):
            by_budget.setdefault(self._budget(ex), []).append(i)
        for budget, idx in by_budget.items():
            if is_api:
                from medray.engines.api import ChatRequest

                reqs = [ChatRequest(prompts[i].system, prompts[i].user,
                                    tuple(items[i]["images"]),
                                    meta_dict(items[i].get("meta")).get("image_root"))
                        for i in idx]
                res = self.engine.chat(reqs, max_new_tokens=budget)
            elif vision:
                res = self._generate_with_images([items[i] for i in idx],
                                                 [prompts[i] for i in idx], budget)
            else:
                tok = getattr(self.engine, "tokenizer", None)
                res = self.engine.generate([prompt_text(prompts[i], tok, self.prompt)
                                            for i in idx],
                                           max_new_tokens=budget)
            for i, gen in zip(idx, res, strict=True):
                gens[i] = gen
        rows = []
        for ex, gen in zip(items, gens, strict=True):
            text, labels, ok = mcq.read_answer(gen.text, ex, self.cfg.group_as_multiple)
            extra = self._mcq_fields(ex, len(ex["images"]) if is_api or vision else 0)
            row = self._generation_row(ex, text, gen, ok, extra.pop("prompt_format"),
                                       labels=list(labels), **extra)
            if self.loglik and ex["kind"] == "single":
                row.update(mcq.loglik_choice(self.engine, ex))
            rows.append(row)
        return rows

    def _generate_with_images(self, items: list[dict], prompts: list[Any],
                              budget: int) -> list[Any]:
        """A local vision-language model's answers: each prompt with its item's images
        (read and re-checked here, inside the item's image root)."""
        from medray.models.vision import load_images

        tok = getattr(self.engine, "tokenizer", None)
        token = getattr(self.engine, "image_token", "<image>")
        texts = [prompt_text(p, tok, self.prompt, len(ex["images"]), token)
                 for p, ex in zip(prompts, items, strict=True)]
        images = [load_images(ex["images"], meta_dict(ex.get("meta")).get("image_root"))
                  for ex in items]
        return self.engine.generate(texts, max_new_tokens=budget, images=images)
