"""`medray report`'s results_lm_eval.json, read by lm-evaluation-harness itself (its result
schema and its `make_table`), and the per-item data behind samples.html, checked against the
runs' own files. Two in-process baseline runs, no model, no Ray (~10 s)."""

from __future__ import annotations

import json

import pytest

from medray.eval.samples import samples_data
from medray.eval.samples_page import embed_json, render_page


def _metrics(run) -> dict:
    return json.loads((run / "metrics.json").read_text())


def test_lm_eval_results_pass_lm_evals_schema_and_table(baseline_report):
    pytest.importorskip("lm_eval")
    from lm_eval.result_schema import EvalResults
    from lm_eval.utils import make_table
    from pydantic import TypeAdapter

    out, runs = baseline_report["out"], baseline_report["runs"]
    assert "results_lm_eval.json" in baseline_report["output"]
    results = json.loads((out / "results_lm_eval.json").read_text())
    TypeAdapter(EvalResults).validate_python(results)  # lm-eval's own schema, key by key
    assert set(results) >= {"results", "configs", "versions", "n-shot", "n-samples",
                            "higher_is_better", "config", "medray"}

    mcq, gen = _metrics(runs["emq-random"]), _metrics(runs["medqaro-rt"])
    emq, mq = results["results"]["medray_europemedqa_test"], results["results"][
        "medray_medqaro_test"]
    acc = mcq["metrics"]["mcq"]["metrics"]["accuracy"]
    assert emq["acc,none"] == acc["mean"]
    assert emq["acc_stderr,none"] == pytest.approx((acc["ci95"][1] - acc["ci95"][0]) / 3.92,
                                                   rel=1e-3)
    assert emq["conforming_rate,none"] == 1.0 and emq["sample_len"] == 48
    f1 = gen["metrics"]["medqaro"]["metrics"]
    assert mq["f1,medqaro"] == f1["f1"]["mean"] and mq["exact_match,medqaro"] == f1["em"]["mean"]
    assert mq["bleu,medqaro"] == f1["bleu"]["mean"] and mq["meteor,medqaro"] == f1["meteor"]["mean"]
    assert results["n-samples"]["medray_medqaro_test"] == {"original": 164, "effective": 164}
    assert results["n-shot"] == {"medray_europemedqa_test": 0, "medray_medqaro_test": 0}
    assert results["higher_is_better"]["medray_europemedqa_test"]["acc"] is True

    extra = results["medray"]["tasks"]["medray_medqaro_test"]
    assert extra["run"] == "medqaro-rt" and extra["split"] == "test" and extra["n"] == 164
    assert extra["context_tokens"] == 64 and extra["metric_modes"] == ["medqaro"]
    assert extra["ci95"]["f1,medqaro"] == f1["f1"]["ci95"]
    assert extra["scores"]["medqaro"]["ci"]["unit"] == "patient"
    for key in ("model", "adapter", "prompt_format", "chat_template", "strategy", "engine"):
        assert key in extra

    table = make_table(results)  # lm-eval's own renderer
    assert "europemedqa test (emq-random)" in table and "medqaro test (medqaro-rt)" in table
    assert f"{acc['mean']:.4f}" in table and f"{f1['f1']['mean']:.4f}" in table
    assert "|acc " in table and "|f1 " in table and "medqaro" in table


def test_two_runs_of_one_dataset_get_their_own_tasks(baseline_report):
    from medray.eval.lm_eval_results import lm_eval_results

    run = baseline_report["runs"]["emq-random"]
    results = lm_eval_results([run, run.parent / "copy"], [_metrics(run)] * 2)
    assert list(results["results"]) == ["medray_europemedqa_test_emq-random",
                                        "medray_europemedqa_test_copy"]
    same = lm_eval_results([run, run.parent / "x" / run.name], [_metrics(run)] * 2)
    assert list(same["results"]) == ["medray_europemedqa_test_emq-random",
                                     "medray_europemedqa_test_emq-random_"]


def test_a_run_without_its_predictions_still_reports(baseline_report, tmp_path):
    """Only metrics.json left (predictions moved away): the tables and the lm-eval file as
    before; samples.html shows the other runs and names the one it could not read."""
    from typer.testing import CliRunner

    from medray.cli import app

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.json").write_text(
        (baseline_report["runs"]["emq-random"] / "metrics.json").read_text())
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", str(bare), str(baseline_report["runs"][
        "medqaro-rt"]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "medray_europemedqa_test" in json.loads((out / "results_lm_eval.json").read_text())[
        "results"]
    data = samples_data([bare, baseline_report["runs"]["medqaro-rt"]])
    assert [u["run"] for u in data["unread"]] == ["bare"] and len(data["items"]) == 164
    assert '"unread":[{"run":"bare","why":' in (out / "samples.html").read_text()


def test_samples_data_matches_the_runs_files(baseline_report):
    runs = baseline_report["runs"]
    data = samples_data([runs["emq-random"], runs["medqaro-rt"]])
    assert [r["name"] for r in data["runs"]] == ["emq-random", "medqaro-rt"]
    assert data["fields"] == ["dataset", "split", "question_type", "kind", "country",
                              "language", "modality"]
    items = {(it["f"]["dataset"], it["id"]): it for it in data["items"]}
    assert len(items) == len(data["items"]) == 48 + 164
    gold = {r["id"]: r for r in map(json.loads, (runs["emq-random"] / "references.jsonl").open())}
    for pred in map(json.loads, (runs["emq-random"] / "predictions.jsonl").open()):
        item = items[("europemedqa", pred["id"])]
        right = sorted(pred["prediction"]) == sorted(gold[pred["id"]]["answer"])
        assert item["r"][0][:3] == [pred["prediction"], float(right),
                                    "right" if right else "wrong"]
        assert item["r"][1] is None and item["q"] == gold[pred["id"]]["question"]
        assert len(item["opts"]) == len(gold[pred["id"]]["options"])
        assert item["f"]["country"] == pred["id"][:2]
    medqaro = [it for it in data["items"] if it["f"]["dataset"] == "medqaro"]
    assert all(it["ctx"] in data["contexts"] for it in medqaro)
    assert {it["f"]["question_type"] for it in medqaro} == {"binary", "extractive", "reasoning"}
    saved = _metrics(runs["medqaro-rt"])["metrics"]["medqaro"]["metrics"]["f1"]["mean"]
    assert sum(it["r"][1][1] for it in medqaro) / len(medqaro) == pytest.approx(saved, abs=1e-3)


def test_page_embeds_clinical_text_safely():
    evil = "</script><script>window.pwned=1</script><!-- & \u2028 <b>"
    text = embed_json({"q": evil})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"q": evil}
    page = render_page({"runs": [], "fields": [], "contexts": {}, "items": []},
                       title="<runs & more>")
    assert "<title>&lt;runs &amp; more&gt;</title>" in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch, ever
    assert "fetch(" not in page and "XMLHttpRequest" not in page
    assert "default-src 'none'" in page


def test_loglik_two_metric_modes_and_undefined_means(baseline_report):
    """Option log-likelihood as the `loglik` filter, each generative metric mode as its own
    filter, and a metric with nothing to average left out (lm-eval's schema wants numbers)."""
    pytest.importorskip("lm_eval")
    from lm_eval.result_schema import EvalResults
    from lm_eval.utils import make_table
    from pydantic import TypeAdapter

    from medray.eval.lm_eval_results import lm_eval_results

    runs = baseline_report["runs"]
    mcq = _metrics(runs["emq-random"])
    block = mcq["metrics"]["mcq"]
    block["loglik"] = {"n": 36, "acc": {"mean": 0.25, "ci95": [0.1, 0.4]},
                       "acc_norm": {"mean": 0.3, "ci95": [0.15, 0.45]}}
    block["metrics"]["accuracy"] = {"mean": None, "ci95": [None, None]}
    gen = _metrics(runs["medqaro-rt"])
    gen["metrics"]["robust"] = json.loads(json.dumps(gen["metrics"]["medqaro"])) | {
        "mode": "robust"}
    gen["run"]["sample"] = {"n": 164, "seed": 3, "of": 400}
    results = lm_eval_results([runs["emq-random"], runs["medqaro-rt"]], [mcq, gen])
    TypeAdapter(EvalResults).validate_python(results)
    emq, mq = results["results"].values()
    assert "acc,none" not in emq and emq["acc,loglik"] == 0.25
    assert emq["acc_norm_stderr,loglik"] == pytest.approx(0.3 / 3.92, rel=1e-3)
    assert mq["f1,medqaro"] == mq["f1,robust"]
    assert results["n-samples"]["medray_medqaro_test"] == {"original": 400, "effective": 164}
    table = make_table(results)
    assert "loglik" in table and "robust" in table and "|acc_norm" in table
