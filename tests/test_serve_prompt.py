"""A served model is prompted as it was trained: its prompt.json, with only the fields a
config really sets laid over it, through Serve's config, /v1/models, /v1/qa and an eval run
whose actors read the endpoint's card.

The session app serves `medray:asked`, an adapter whose prompt.json differs from the
defaults in every field, with `prompt: {max_new_tokens: 10}` in the app config (conftest).
"""

from __future__ import annotations

import json

from conftest import ASKED_PROMPT

ASKED = "medray:asked"
SERVED = {**ASKED_PROMPT, "max_new_tokens": 10}  # the one field the app config sets


def test_models_card_shows_the_trained_prompt_under_the_configured_field(client):
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards[ASKED]["prompt"] == SERVED
    assert cards["medray"]["prompt"]["format"] == "qea"  # no prompt.json: the defaults


def test_qa_prompts_with_the_trained_format_strategy_and_budget(client, serve_app,
                                                                medqaro_prepared):
    from transformers import AutoTokenizer

    from medray.data.prepared import load_prepared
    from medray.prompts.spec import PromptSpec
    from medray.prompts.strategies import plan_strategy

    _, _, cfg = serve_app
    data = load_prepared(medqaro_prepared)
    ex = data.split("test").iloc[0]
    context = data.context(ex["context_id"])
    r = client.post("/v1/qa", json={"question": ex["question"], "context": context,
                                    "adapter": "asked", "return_prompt_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt"] == SERVED and body["strategy"] == "chunks"
    expected = plan_strategy(AutoTokenizer.from_pretrained(cfg.model), ex["question"],
                             context, PromptSpec(**SERVED))
    assert body["prompt_ids"] == expected.prompts and len(expected.prompts) > 1


def test_an_eval_run_through_actors_uses_the_served_prompt_with_its_own_override(
        serve_app, medqaro_prepared, tmp_path, monkeypatch):
    from medray.eval.config import EvalConfig
    from medray.eval.runner import run_eval

    url, key, _ = serve_app
    monkeypatch.setenv("MEDRAY_TEST_KEY", key)
    cfg = EvalConfig.model_validate({
        "data": str(medqaro_prepared), "limit": 3, "actors": 1,
        "engine": {"kind": "serve", "url": url, "adapter": "asked",
                   "api_key_env": "MEDRAY_TEST_KEY"},
        "prompt": {"context_tokens": 144},
        "score": {"modes": ["medqaro"], "resamples": 0, "wordnet": False}})
    run_eval(cfg, tmp_path / "run")
    run = json.loads((tmp_path / "run" / "metrics.json").read_text())["run"]
    assert run["prompt_spec"] == {**SERVED, "context_tokens": 144}
    assert (run["prompt_format"], run["context_tokens"], run["strategy"]) == ("eqa", 144,
                                                                              "chunks")
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["prompt"] == {"context_tokens": 144}  # the config as given
