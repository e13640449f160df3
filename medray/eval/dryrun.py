"""`medray eval --dry-run`: the prompts a run would send (MedQARo epicrises elided: clinical
text), the item count and a token/cost estimate. It never builds an engine."""

from __future__ import annotations

from medray.engines.accounting import PRICES_AS_OF, cost_usd, estimate_tokens
from medray.eval.plan import EvalPlan
from medray.prompts.text import example_dict, medqaro_prompt, render

IMAGE_TOKENS_ESTIMATE = 1600  # per image, dry-run estimate only (providers differ)


def dry_run_report(plan: EvalPlan, show: int = 2) -> dict:
    cfg, data, spec = plan.cfg, plan.data, plan.cfg.engine
    shown, in_tok, out_tok, n_images = [], 0, 0, 0
    items = plan.items
    if data.kind == "mcq":
        for i, row in enumerate(items.to_dict("records")):
            ex = example_dict(row)
            p = render(ex, plan.shots, cfg.group_as_multiple)
            in_tok += estimate_tokens(p.text) + IMAGE_TOKENS_ESTIMATE * len(ex["images"])
            out_tok += plan.budget(ex)
            n_images += len(ex["images"])
            if i < show:
                shown.append(p.messages())
    else:
        budget = plan.budget()
        for i, (q, c) in enumerate(zip(items["question"], items["context_id"], strict=True)):
            prompt = medqaro_prompt(q, data.context(c))
            in_tok += estimate_tokens(prompt)
            out_tok += budget
            if i < show:
                shown.append([{"role": "user", "content": medqaro_prompt(
                    q, f"[epicrisis elided: {len(prompt)} chars of clinical text]")}])
    cost = cost_usd(spec.target, in_tok, out_tok) if spec.external else 0.0
    return {"dry_run": True, "engine": str(spec), "dataset": data.dataset,
            "n_items": int(len(items)), "n_images": n_images, "prompts": shown,
            "governance": plan.governance,
            "estimate": {"input_tokens": in_tok, "output_tokens_max": out_tok,
                         "cost_usd_max": None if cost is None else round(cost, 4),
                         "how": f"~{4} characters per token, {IMAGE_TOKENS_ESTIMATE} tokens "
                                "per image, every item at its max output tokens; list "
                                f"prices as of {PRICES_AS_OF}; a cached answer costs 0"}}
