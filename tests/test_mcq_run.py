"""Multiple choice end to end on synthetic RoBiology / EuropeMedQA: prompts per kind and
shots, extraction, non-conforming excluded and counted, image items (sent to API engines in
order, skipped by text-only ones), option log-likelihood, resume, dry run, translation.
Budget: ~20 s (scripted engine and local fake servers; no model)."""

from __future__ import annotations

import base64
import json

import pytest
from fakes import FakeAnthropic, FakeOpenAI, ScriptedEngine
from typer.testing import CliRunner

from medray.cli import app
from medray.data.prepared import load_prepared
from medray.data.schema import GROUP_CODES
from medray.eval.config import engine_config
from medray.eval.mcq import answer_text
from medray.eval.runner import run_eval
from medray.prompts.text import format_question_text


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-mcq")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-mcq")


def run_external_eval(engine, data_dir, output, *, base_url=None, cache=None, injected=None,
                      **fields):
    """`medray eval --engine ENGINE --data DIR` as a Python call (the same config)."""
    cfg = engine_config(engine, data_dir, base_url=base_url, cache=cache, **fields)
    return run_eval(cfg, output, engine=injected)


def _mcq(summary):
    return summary["metrics"]["mcq"]


def _gold(data_dir):
    """Rendered question block (question + options) -> (id, key, kind)."""
    ex = load_prepared(data_dir).examples
    return {format_question_text(r["question"], list(r["options"])):
            (r["id"], list(r["answer"]), r["kind"]) for _, r in ex.iterrows()}


def _item_of(text, gold):
    hits = [v for q, v in gold.items() if q in text]
    assert hits, text[:200]
    return max(hits, key=lambda v: len(v[0]))


def test_text_only_engine_skips_images_counts_nonconforming_exact_accuracy(
        europemedqa_prepared, tmp_path):
    data = load_prepared(europemedqa_prepared)
    items = data.split("test")
    gold = _gold(europemedqa_prepared)
    ids = sorted(items["id"])
    wrong_ids, junk_ids = set(ids[1::4]), set(ids[2::4])

    def answer(prompt):
        item_id, key, kind = _item_of(prompt, gold)
        if item_id in junk_ids:
            return "I think the answer depends on the patient."
        if item_id in wrong_ids:
            return f"{item_id}: " + ("A" if key != ["A"] else "B")
        return f"{item_id}: " + ",".join(key)

    engine = ScriptedEngine(answer, option_logprob=lambda p, c: -len(c))
    m = _mcq(run_external_eval("hf:scripted", europemedqa_prepared, tmp_path / "run",
                               injected=engine))
    with_images = {i for i, im in zip(items["id"], items["images"], strict=True) if len(im)}
    asked = [i for i in ids if i not in with_images]
    assert m["n_skipped_images"] == len(with_images) == 6 and len(engine.prompts) == len(asked)
    junk = [i for i in asked if i in junk_ids]
    right = [i for i in asked if i not in junk_ids and i not in wrong_ids]
    assert m["n"] == len(asked) and m["n_nonconforming"] == len(junk)
    assert m["n_conforming"] == len(asked) - len(junk)
    acc = m["metrics"]["accuracy"]
    assert acc["mean"] == pytest.approx(len(right) / (len(asked) - len(junk)))
    assert acc["ci95"][0] < acc["mean"] < acc["ci95"][1]
    assert sum(m["key_distribution"].values()) >= len(asked)
    # the protocol's minimal output budget: single 12 tokens, France's multi-answer 20
    assert set(engine.max_tokens) == {12, 20}
    # option log-likelihood: the scripted engine prefers the shortest option text
    single = items[(items["kind"] == "single") & ~items["id"].isin(with_images)]
    expect = [min(opts, key=lambda o: len(o["text"]))["label"] == ans[0]
              for opts, ans in zip(single["options"], single["answer"], strict=True)]
    assert m["loglik"]["n"] == len(single)
    assert m["loglik"]["acc"]["mean"] == pytest.approx(sum(expect) / len(expect))
    assert set(m["by"]["modality"]) == {"text_only"}


def test_question_id_prefix_rules():
    ex = {"dataset": "europemedqa", "id": "IT0003", "meta": json.dumps({"original_id": "IT0003"})}
    assert answer_text("IT0003: B", ex) == ("B", True)
    assert answer_text("B", ex) == ("B", True)
    assert answer_text("FR0009: B", ex)[1] is False  # answered another item's id


def test_resume_after_crash_asks_only_missing_items(robiology_prepared, tmp_path):
    data = load_prepared(robiology_prepared)
    items = data.split("test")
    out = tmp_path / "run"
    crashing = ScriptedEngine(lambda p: "A", fail_after=16)  # dies in the 2nd batch
    with pytest.raises(RuntimeError, match="scripted crash"):
        run_external_eval("hf:scripted", robiology_prepared, out, injected=crashing)
    done = (out / "predictions.jsonl").read_text().splitlines()
    assert len(done) == 16 and not (out / "metrics.json").exists()
    with (out / "predictions.jsonl").open("a") as f:
        f.write('{"id": "trunc')  # a line cut by the crash
    engine = ScriptedEngine(lambda p: "A")
    m = run_external_eval("hf:scripted", robiology_prepared, out, injected=engine)
    assert m["requests"]["resumed"] == 16 and len(engine.prompts) == len(items) - 16
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(items["id"])  # each id once, none lost


def test_resume_with_a_different_config_is_an_error_naming_the_keys(robiology_prepared,
                                                                    tmp_path):
    out = tmp_path / "run"
    run_external_eval("hf:scripted", robiology_prepared, out, sample=10,
                      injected=ScriptedEngine(lambda p: "A"))
    config = (out / "config.json").read_text()
    engine = ScriptedEngine(lambda p: "A")
    with pytest.raises(ValueError, match="different run") as err:
        run_external_eval("hf:scripted", robiology_prepared, out, sample=12, shots=1,
                          injected=engine)
    assert "sample: 10 -> 12" in str(err.value) and "prompt.shots: None -> 1" in str(err.value)
    assert "config.json" in str(err.value)
    assert engine.prompts == [] and (out / "config.json").read_text() == config
    # settings of how a run executes (not what it computes) may change on resume
    again = run_external_eval("hf:scripted", robiology_prepared, out, sample=10,
                              concurrency=8, injected=engine)
    assert again["requests"]["requested"] == 0 and engine.prompts == []
    # the same through the CLI: exit 2, the differing key named, nothing asked
    result = CliRunner().invoke(app, [
        "eval", "--engine", "openai:gpt-4o-mini", "--data", str(robiology_prepared),
        "--output", str(out), "--sample", "10"])
    assert result.exit_code == 2 and "engine.kind: 'hf' -> 'openai'" in result.output


def test_robiology_shots_and_group_as_multiple_through_anthropic(robiology_prepared, tmp_path):
    gold = _gold(robiology_prepared)

    def respond(body):
        text = body["messages"][0]["content"][0]["text"]
        _, key, kind = _item_of(text.split("\n\nYou received")[0], gold)
        if kind == "group":  # asked as multiple choice: answer the true statements
            return ", ".join(str(n) for n in sorted(GROUP_CODES[key[0]]))
        return "".join(key)

    with FakeAnthropic(responder=respond) as server:
        full = run_external_eval("anthropic:claude-3-5-haiku-20241022", robiology_prepared,
                                 tmp_path / "run", base_url=server.url, shots=3,
                                 group_as_multiple=True, cache=tmp_path / "c.sqlite")
        m = _mcq(full)
        assert m["metrics"]["accuracy"]["mean"] == 1.0 and m["n_nonconforming"] == 0
        assert set(m["per_kind"]) == {"single", "group", "multiple"}
        systems = [b["system"] for b in server.bodies]
        assert all(s.count("# Answer:") == 3 for s in systems)  # 3 shots in the system prompt
        group_prompts = [b for b in server.bodies if "# Answer: 1" in b["system"]
                         or "# Answer: 2" in b["system"] or "# Answer: 4" in b["system"]]
        assert group_prompts  # group shots re-expressed as statement numbers
        calls = server.calls
        # rerun into a fresh directory: every answer comes from the cache
        again = run_external_eval("anthropic:claude-3-5-haiku-20241022", robiology_prepared,
                                  tmp_path / "run2", base_url=server.url, shots=3,
                                  group_as_multiple=True, cache=tmp_path / "c.sqlite")
        assert server.calls == calls and again["usage"]["calls"] == 0
        assert _mcq(again)["metrics"] == m["metrics"]


def test_api_engine_gets_images_in_order_and_resumed_run_makes_no_calls(
        europemedqa_prepared, tmp_path):
    data = load_prepared(europemedqa_prepared)
    two = data.examples[data.examples["images"].map(len) == 2].iloc[0]
    with FakeAnthropic(responder=lambda b: "A") as server:
        kw = dict(base_url=server.url, cache=tmp_path / "c.sqlite")
        m = _mcq(run_external_eval("anthropic:m", europemedqa_prepared, tmp_path / "run", **kw))
        assert m["n_skipped_images"] == 0 and m["n"] == len(data.examples)
        body = next(b for b in server.bodies
                    if f"QuestionID: {json.loads(two['meta'])['original_id']}"
                    in b["messages"][0]["content"][0]["text"])
        sent = [base64.b64decode(c["source"]["data"]) for c in body["messages"][0]["content"][1:]]
        assert sent == [open(p, "rb").read() for p in two["images"]]  # case, then sub-question
        assert set(m["by"]["modality"]) == {"text_only", "with_images"}
        calls = server.calls
        m2 = run_external_eval("anthropic:m", europemedqa_prepared, tmp_path / "run", **kw)
        assert server.calls == calls and m2["requests"]["requested"] == 0
    with pytest.raises(ValueError, match="different run"):
        run_external_eval("anthropic:other", europemedqa_prepared, tmp_path / "run", **kw)


def test_engine_flags_set_only_the_prompt_fields_given(europemedqa_prepared):
    plain = engine_config("hf:m", europemedqa_prepared)
    assert plain.prompt is None  # the model's own prompt, chat template "auto"
    forced = engine_config("hf:m", europemedqa_prepared, chat_template=False, shots=0)
    assert forced.model_dump(mode="json")["prompt"] == {"chat_template": False}


def test_dry_run_calls_nothing(europemedqa_prepared, tmp_path):
    with FakeOpenAI() as server:
        result = CliRunner().invoke(app, [
            "eval", "--engine", "openai:gpt-4o-mini", "--base-url", server.url + "/v1",
            "--data", str(europemedqa_prepared), "--output", str(tmp_path / "run"),
            "--sample", "10", "--seed", "3", "--dry-run"])
        assert result.exit_code == 0, result.output
        assert server.calls == 0
    assert "QuestionID:" in result.output and "10 items" in result.output
    assert "cost at most" in result.output and not (tmp_path / "run").exists()


def test_translation_pipeline_preserves_ids_and_is_cached(europemedqa_prepared, tmp_path):
    from medray.engines.registry import build_engine
    from medray.eval.translate import translate_dataset

    def translate(body):
        obj = json.loads(body["messages"][-1]["content"])
        return "```json\n" + json.dumps({k: f"EN[{v}]" for k, v in obj.items()}) + "\n```"

    src = load_prepared(europemedqa_prepared)
    with FakeOpenAI(responder=translate) as server:
        engine = build_engine("openai:gpt-4o-mini", base_url=server.url + "/v1",
                              cache=tmp_path / "c.sqlite")
        out = translate_dataset(europemedqa_prepared, tmp_path / "en", engine)
        assert server.calls == len(src.examples)  # one call per item
        result = CliRunner().invoke(app, [  # rerun through the CLI: all from the cache
            "translate", "--engine", "openai:gpt-4o-mini", "--base-url", server.url + "/v1",
            "--data", str(europemedqa_prepared), "--output", str(tmp_path / "en2"),
            "--cache", str(tmp_path / "c.sqlite")])
        assert result.exit_code == 0, result.output
        assert "new calls 0, cached 48" in result.output
        assert server.calls == len(src.examples)
    a = src.examples.set_index("id")
    b = out.examples.set_index("id")
    assert list(a.index) == list(b.index) and set(b["language"]) == {"en"}
    assert out.manifest["language"] == "en"
    for i in a.index:
        assert list(a.loc[i, "answer"]) == list(b.loc[i, "answer"])
        assert b.loc[i, "question"] == f"EN[{a.loc[i, 'question']}]"
        labels = [o["label"] for o in a.loc[i, "options"]]
        assert [o["label"] for o in b.loc[i, "options"]] == labels
        assert json.loads(b.loc[i, "meta"])["translated_from"] == a.loc[i, "language"]
    # both tracks evaluated the same way, side by side (original language vs English)
    from medray.eval.translate import language_table

    for name, d in (("orig", europemedqa_prepared), ("en", tmp_path / "en")):
        run_external_eval("hf:unused", d, tmp_path / f"run-{name}",
                          injected=ScriptedEngine(lambda p: "A"))
    # (a run folder never goes inside its input: the runs lie beside the datasets)
    table = language_table([tmp_path / "run-orig", tmp_path / "run-en"])
    assert table[0]["languages"] == ["es", "fr", "it", "pt"] and table[1]["languages"] == ["en"]
    assert table[0]["n"] == table[1]["n"] and table[0]["n_skipped_images"] == 6
    assert table[0]["text_only"] is not None and table[0]["with_images"] is None


def test_real_europemedqa_slice_with_tiny_local_model(shared_data, tiny_model, tmp_path):
    """The real Italian SSM slice (1,060 items, key 'A' for 962 before shuffling) through
    `medray eval --engine hf:PATH` on a seeded sample: accuracy with CIs, conforming
    counts, option log-likelihood, and the per-letter key distribution after shuffling.
    Heavy (torch, tiny model): run under flock; ~30 s."""
    from collections import Counter

    from medray.data.prepare import prepare

    src = shared_data / "europemedqa" / "ssm_questions_text_only.json"
    if not src.is_file():
        pytest.skip(f"{src} not available")
    data_dir = tmp_path / "emq"
    full = prepare("europemedqa", src, data_dir)
    keys = Counter(a for ans in full.examples["answer"] for a in ans)
    assert len(full.examples) == 1060 and sum(keys.values()) == 1060
    assert all(150 <= keys[c] <= 270 for c in "ABCDE"), keys  # ~uniform (was 91% 'A')

    result = CliRunner().invoke(app, [
        "eval", "--engine", f"hf:{tiny_model}", "--data", str(data_dir),
        "--output", str(tmp_path / "run"), "--sample", "30", "--seed", "0"])
    assert result.exit_code == 0, result.output
    print(result.output)  # the report a user sees (pytest -rP shows it)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    m = {**saved, **_mcq(saved)}  # the run's record and its multiple-choice score
    lines = result.output.splitlines()
    assert (f"hf:{tiny_model} on europemedqa split test, n=30 (seeded sample 30 of 1060, "
            "seed 0); prompt: mcq prompt per kind (europemedqa), 0-shot; the model's chat "
            "template") in " ".join(result.output.split())  # auto: the tiny model has one
    assert saved["run"]["prompt_spec"]["chat_template"] is True  # what auto became
    acc_line = next(x for x in lines if x.startswith("accuracy "))  # accuracy with its CI
    assert "all-correct rule" in acc_line
    assert ("[95% CI" if m["n_conforming"] else "n/a (nothing to average)") in acc_line
    assert f"{m['n_conforming']} conforming of 30 outputs" in acc_line  # conforming counts
    assert f"{m['n_nonconforming']} non-conforming excluded" in acc_line
    # per-letter distribution of the gold keys after shuffling, printed and in metrics.json
    assert m["shuffle"]["enabled"] and m["key_distribution_split"]["counts"] == dict(keys)
    shuffled = f"options shuffled per item, seed {m['shuffle']['seed']}"
    sampled = next(x for x in lines if x.startswith(f"gold-key letters ({shuffled}), of the 30"))
    whole = next(x for x in lines if x.startswith("gold-key letters over the whole test split "
                                                   "(1060 items)"))
    for line, counts in ((sampled, m["key_distribution"]), (whole, keys)):
        assert all(f"{c} {counts[c]} (" in line for c in "ABCDE"), line
    assert m["n"] == 30 and m["n_conforming"] + m["n_nonconforming"] == 30
    assert m["n_skipped_images"] == 0 and sum(m["key_distribution"].values()) == 30
    acc = m["metrics"]["accuracy"]
    if m["n_conforming"]:
        assert acc["ci95"][0] <= acc["mean"] <= acc["ci95"][1]
    ll = m["loglik"]  # every single-answer item is scored by option log-likelihood
    assert ll["n"] == 30
    for k in ("acc", "acc_norm"):
        assert 0 <= ll[k]["ci95"][0] <= ll[k]["mean"] <= ll[k]["ci95"][1] <= 1
    ll_line = next(x for x in lines if x.startswith("option log-likelihood"))
    assert f"acc {ll['acc']['mean']:.4f} [95% CI {ll['acc']['ci95'][0]:.4f}" in ll_line
    rows = [json.loads(x) for x in (tmp_path / "run" / "predictions.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 30 and all(r["engine"] == "hf" and r["n_tokens"] <= 12 for r in rows)


def test_api_engine_through_an_eval_config_is_the_same_run(europemedqa_prepared, tmp_path):
    """`medray eval --config` takes every engine kind: the YAML below is what
    `--engine anthropic:m --sample 3` stands for, and both write the same run folder."""
    import yaml

    with FakeAnthropic(responder=lambda b: "A") as server:
        flags = CliRunner().invoke(app, [
            "eval", "--engine", "anthropic:m", "--base-url", server.url,
            "--data", str(europemedqa_prepared), "--output", str(tmp_path / "flags"),
            "--sample", "3", "--cache", str(tmp_path / "c.sqlite")])
        assert flags.exit_code == 0, flags.output
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump({
            "data": str(europemedqa_prepared), "sample": 3,
            "cache": str(tmp_path / "c.sqlite"),
            "engine": {"kind": "anthropic", "model": "m", "base_url": server.url},
            "score": {"by": ["language", "modality"]}}))
        config = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--output",
                                          str(tmp_path / "config")])
        assert config.exit_code == 0, config.output
        assert server.calls == 3  # the second run's answers all came from the cache
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("flags", "config"))
    assert a["run"] == b["run"] and b["run"]["engine"] == "anthropic" and b["run"]["n"] == 3
    for key in ("metrics", "by", "per_kind", "n_conforming", "key_distribution"):
        assert a["metrics"]["mcq"][key] == b["metrics"]["mcq"][key], key
    rows = [{r["id"]: (r["prediction"], r["raw_output"], r["conforming"]) for r in map(
        json.loads, (tmp_path / d / "predictions.jsonl").read_text().splitlines())}
        for d in ("flags", "config")]
    assert rows[0] == rows[1] and len(rows[0]) == 3
    # the configs differ only in settings that do not change what is computed
    ca, cb = (json.loads((tmp_path / d / "config.json").read_text())
              for d in ("flags", "config"))
    from medray.eval.runio import config_diff

    assert set(config_diff(ca, cb)) <= {"engine.timeout_s"}
