"""The data CLI end to end: real EuropeMedQA slice, synthetic corpora, stats and prompts."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from medray.cli import app
from medray.data.europemedqa import permutation

runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_real_europemedqa_slice_is_debiased_and_deterministic(shared_data, tmp_path):
    raw = shared_data / "europemedqa" / "ssm_questions_text_only.json"
    original = json.loads(raw.read_text())
    assert sum(q["correct_answer"]["letter"] == "A" for q in original) / len(original) > 0.9

    invoke("data", "prepare", "--dataset", "europemedqa", "--input", str(raw),
           "--out", str(tmp_path / "a"))
    stats = json.loads(invoke("data", "stats", str(tmp_path / "a"), "--json"))
    letters = stats["answer_letters"]
    assert sum(letters.values()) == stats["examples"] == len(original)
    assert max(letters.values()) / sum(letters.values()) <= 0.26, letters

    invoke("data", "prepare", "--dataset", "europemedqa", "--input", str(raw),
           "--out", str(tmp_path / "b"))
    first = pd.read_parquet(tmp_path / "a" / "examples.parquet")
    second = pd.read_parquet(tmp_path / "b" / "examples.parquet")
    assert first["options"].map(list).tolist() == second["options"].map(list).tolist()
    assert first["answer"].map(list).tolist() == second["answer"].map(list).tolist()

    # The key moved with its option text; the permutation is a function of the id alone.
    by_id = {q["id"]: q for q in original}
    for row in first.head(50).to_dict("records"):
        source = by_id[row["id"]]
        key_text = source["options"][source["correct_answer"]["index"]]["text"]
        new_key = [o["text"] for o in row["options"] if o["label"] == row["answer"][0]][0]
        assert new_key == key_text
        order = json.loads(row["meta"])["permutation"]
        assert order == ["ABCDE"[i] for i in permutation(row["id"], 5)]


def test_no_shuffle_keeps_the_original_order(shared_data, tmp_path):
    raw = shared_data / "europemedqa" / "ssm_questions_text_only.json"
    invoke("data", "prepare", "--dataset", "europemedqa", "--input", str(raw),
           "--out", str(tmp_path / "plain"), "--no-shuffle")
    stats = json.loads(invoke("data", "stats", str(tmp_path / "plain"), "--json"))
    assert stats["answer_letters"]["A"] == 962


def test_synthetic_medqaro_round_trip(synthetic_medqaro_raw, tmp_path):
    out = tmp_path / "prepared"
    printed = invoke("data", "prepare", "--dataset", "medqaro", "--input",
                     str(synthetic_medqaro_raw), "--out", str(out))
    assert "train:" in printed and "contexts stored once" in printed
    stats = json.loads(invoke("data", "stats", str(out), "--json"))
    examples = pd.read_parquet(out / "examples.parquet")
    contexts = pd.read_parquet(out / "contexts.parquet")
    assert stats["examples"] == len(examples)
    assert stats["contexts"] == examples["patient_id"].nunique() == len(contexts)
    assert set(stats["splits"]) == {"train", "val", "test", "test_cross"}
    assert sum(stats["patients"].values()) == stats["contexts"]
    raw_rows = sum(len(pd.read_csv(p, index_col=0)) for p in synthetic_medqaro_raw.glob("*.csv"))
    assert stats["examples"] == raw_rows, "no example may be dropped silently"
    assert (examples[examples["split"] == "test_cross"]["domain"] == "cross").all()
    assert not contexts["text"].str.contains("ş|ţ|\n|\r").any()


def test_prompt_command_renders_the_reference_format(medqaro_prepared):
    examples = pd.read_parquet(medqaro_prepared / "examples.parquet")
    row = examples[examples["split"] == "test"].iloc[0]
    full = invoke("data", "prompt", str(medqaro_prepared), "--id", row["id"]).rstrip("\n")
    assert full.startswith(f"Intrebare: {row['question']} Context: ")
    assert full.endswith(" Raspuns:")
    eqa = invoke("data", "prompt", str(medqaro_prepared), "--id", row["id"], "--format", "eqa")
    assert eqa.startswith("Context: ") and f"Intrebare: {row['question']} Raspuns:" in eqa
    short = invoke("data", "prompt", str(medqaro_prepared), "--id", row["id"],
                   "--context-tokens", "60").rstrip("\n")
    assert len(short.split()) <= 60 - 10
    context = full[len(f"Intrebare: {row['question']} Context: "):-len(" Raspuns:")]
    kept = short[len(f"Intrebare: {row['question']} Context: "):-len(" Raspuns:")]
    assert context.startswith(kept), "trimming keeps the head of the epicrisis"


def test_unknown_id_is_a_clear_error(medqaro_prepared):
    result = runner.invoke(app, ["data", "prompt", str(medqaro_prepared), "--id", "test:nope"])
    assert result.exit_code == 2 and "test:nope" in result.output


def test_synthetic_mcq_datasets_prepare(robiology_prepared, europemedqa_prepared):
    robio = json.loads(invoke("data", "stats", str(robiology_prepared), "--json"))
    assert set(robio["kinds"]) == {"single", "group", "multiple"}
    assert set(robio["splits"]) == {"train", "val", "test"}
    emqa = json.loads(invoke("data", "stats", str(europemedqa_prepared), "--json"))
    assert emqa["removed_no_validated_key"] >= 1
    assert emqa["with_images"] >= 1
    assert set(emqa["languages"]) >= {"it", "fr"}
    shares = [v / sum(emqa["answer_letters"].values()) for v in emqa["answer_letters"].values()]
    assert max(shares) < 0.5, "shuffling undoes the synthetic positional bias"
    prompt = invoke("data", "prompt", str(robiology_prepared), "--id",
                    pd.read_parquet(robiology_prepared / "examples.parquet")["id"].iloc[-1],
                    "--shots", "3")
    assert prompt.count("# Answer:") == 3


def test_synth_defaults_to_the_corpus_its_tiny_recipe_learns_from(tmp_path):
    """RoBiology defaults to the paper-sized corpus (the README's fine-tuning commands pass
    no --scale; 90 items teach the tiny model only the answer format), MedQARo to small."""
    assert "scale paper" in invoke("data", "synth", "-d", "robiology", "--out",
                                   str(tmp_path / "rb"))
    assert len(json.loads((tmp_path / "rb" / "train.json").read_text())) == 11_347
    assert "scale small" in invoke("data", "synth", "-d", "robiology", "--scale", "small",
                                   "--out", str(tmp_path / "rb-small"))
    assert len(json.loads((tmp_path / "rb-small" / "train.json").read_text())) == 90
    assert "scale small" in invoke("data", "synth", "-d", "medqaro", "--out",
                                   str(tmp_path / "mq"))
