"""Evaluation actors: each holds one engine (HTTP client, in-process vLLM, or a baseline)
and turns one example into one prediction row (the predictions-file contract).

The actor class is plain Python; `runner.py` wraps it with `ray.remote` so it can also be
unit-tested in-process.
"""

from __future__ import annotations

import json
from typing import Any

from medray.eval.config import EvalConfig
from medray.prompts import PromptSpec

PREDICTION_FIELDS = ("id", "prediction", "logprob", "n_tokens", "engine", "model", "adapter",
                     "prompt_format", "context_tokens", "raw_output", "conforming")


class EvalWorker:
    def __init__(self, config: dict[str, Any], api_key: str | None = None) -> None:
        from medray.data.prepared import load_prepared

        self.cfg = EvalConfig.model_validate(config)
        # The driver resolved it against the model's own (runner.with_resolved_prompt).
        self.prompt = self.cfg.prompt or PromptSpec()
        self.data = load_prepared(self.cfg.data)  # each actor keeps the epicrises once
        spec = self.cfg.engine
        self.engine: Any = None
        self._baseline: dict[str, dict] = {}
        if spec.kind == "serve":
            from medray.engines.serve import ServeEngine

            # The key comes from the driver (actors do not see its environment).
            self.engine = ServeEngine(spec.url or "", api_key=api_key,
                                      api_key_env=spec.api_key_env,
                                      model=spec.model or "medray", adapter=spec.adapter,
                                      timeout=spec.timeout_s)
        elif spec.kind == "vllm":
            from medray.engines.vllm import VLLMEngine

            self.engine = VLLMEngine(spec.model or "", adapter=spec.adapter,
                                     **spec.vllm_kwargs())
        else:
            self._baseline = {row["id"]: row for row in self._baseline_rows()}

    def _baseline_rows(self) -> list[dict]:
        """Whole-split baseline rows, computed exactly as `medray baseline` does (one seeded
        generator walks the split in table order), then served per item."""
        from medray.eval import baselines as bl

        spec, data = self.cfg.engine, self.data
        examples = data.split(self.cfg.split)
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

    def ready(self) -> bool:
        return True

    def predict(self, example: dict[str, Any]) -> dict[str, Any]:
        """One example (a row of the examples table) -> one predictions-file row."""
        spec = self.cfg.engine
        if spec.kind == "baseline":
            return dict(self._baseline[str(example["id"])])
        if self.data.kind == "generative":
            row = self._generative(example)
        else:
            row = self._mcq(example)
        row.update(id=str(example["id"]), engine=spec.kind, model=spec.label,
                   adapter=spec.adapter)
        return {k: row.get(k) for k in PREDICTION_FIELDS} | {
            k: v for k, v in row.items() if k not in PREDICTION_FIELDS}

    def _generative(self, ex: dict[str, Any]) -> dict[str, Any]:
        spec = self.prompt
        context = self.data.context(ex["context_id"])
        if self.cfg.engine.kind == "serve":
            # Every prompt setting is sent: Serve then prompts exactly as this run says
            # (equal to the served model's own spec unless the eval config overrides it).
            res = self.engine.qa(ex["question"], context, prompt_format=spec.format,
                                 context_tokens=spec.context_tokens, strategy=spec.strategy,
                                 max_new_tokens=spec.max_new_tokens)
            answer, logprob, raw = res["answer"], res["logprob"], res["answer"]
            n_tokens, prompt_tokens = None, res.get("prompt_tokens")
        else:
            from medray.strategies import run_strategy

            def generate(prompts: list[list[int]]):
                return self.engine.generate(prompts, max_new_tokens=spec.max_new_tokens)

            res = run_strategy(generate, self.engine.tokenizer, ex["question"], context, spec)
            answer, logprob, raw, n_tokens = res.answer, res.logprob, res.raw, res.n_tokens
            prompt_tokens = res.prompt_tokens
        return {"prediction": answer, "logprob": logprob, "n_tokens": n_tokens,
                "prompt_format": spec.format, "context_tokens": spec.context_tokens,
                "raw_output": raw, "conforming": True, "strategy": spec.strategy,
                "prompt_tokens": prompt_tokens}

    def _mcq(self, ex: dict[str, Any]) -> dict[str, Any]:
        options = [dict(o) for o in ex["options"]]
        kind = str(ex["kind"])
        if self.cfg.engine.kind == "serve":
            res = self.engine.mcq(ex["question"], options, kind)
            letters, conforming, raw = res["answer"], res["conforming"], res["raw"]
        else:
            from medray.eval.metrics.mcq import extract_answer
            from medray.prompts import mcq_prompt

            meta = ex.get("meta")
            prompt = mcq_prompt({**ex, "options": options,
                                 "meta": json.loads(meta) if isinstance(meta, str) else meta})
            tok = self.engine.tokenizer
            text = (tok.apply_chat_template(prompt.messages(), tokenize=False,
                                            add_generation_prompt=True)
                    if getattr(tok, "chat_template", None) else prompt.text)
            raw = self.engine.generate([text], max_new_tokens=self.prompt.max_new_tokens)[0].text
            valid = [o["label"] for o in options] if kind != "group" else list("ABCDE")
            ext = extract_answer(raw, valid=valid, multi=kind == "multiple")
            letters, conforming = list(ext.labels), ext.conforming
        return {"prediction": "".join(letters), "logprob": None, "n_tokens": None,
                "prompt_format": None, "context_tokens": None, "raw_output": raw,
                "conforming": conforming}
