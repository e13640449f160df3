"""Prompt assembly, labels, trimming, batching/packing, the Ray Data pipeline."""

from __future__ import annotations

import pytest

from medray.prompts.spec import PromptSpec
from medray.prompts.text import medqaro_prompt, medqaro_target
from medray.prompts.tokens import (
    IGNORE_INDEX,
    BudgetError,
    build_chunk_examples,
    build_example,
    build_prompt_ids,
    check_budget,
    encode_context,
)

Q = "Are pacienta metastaze osoase?"
A = "Nu"


def spec(fmt: str = "qea", context_tokens: int = 2048, reserve: int = 0) -> PromptSpec:
    """A prompt spec; reserve 0 = room for the answer itself only (the bare arithmetic)."""
    return PromptSpec(format=fmt, context_tokens=context_tokens, reserve=reserve)


@pytest.fixture(scope="module")
def tok(tiny_model):
    from medray.models import load_tokenizer

    return load_tokenizer(str(tiny_model))


@pytest.fixture(scope="module")
def epicrisis(medqaro_prepared):
    from medray.data.prepared import load_prepared

    return load_prepared(medqaro_prepared).contexts["text"].iloc[0]


@pytest.mark.parametrize("fmt", ["qea", "eqa"])
def test_untrimmed_example_equals_reference_string_tokenisation(tok, epicrisis, fmt):
    ctx = encode_context(tok, epicrisis)
    ex = build_example(tok, Q, A, ctx, spec(fmt, 100_000))
    reference = tok(medqaro_target(medqaro_prompt(Q, epicrisis, fmt), A))["input_ids"]
    assert ex["input_ids"] == reference + [tok.eos_token_id]


def test_training_prompt_is_the_served_prompt_whatever_the_answer_length(tok, epicrisis):
    """With reserve = max_new_tokens, the context shown does not depend on the answer (no
    "shorter context -> longer answer" leak) and equals what serving sends."""
    ctx = encode_context(tok, epicrisis)
    served = build_prompt_ids(tok, Q, ctx, spec("qea", 120, reserve=10))
    for answer in ("Nu", "Da", "12.03.2019", "carcinom ductal invaziv"):
        ex = build_example(tok, Q, answer, ctx, spec("qea", 120, reserve=10))
        n_target = sum(x != IGNORE_INDEX for x in ex["labels"])
        assert n_target <= 10
        assert ex["input_ids"][:-n_target] == served
    # An answer longer than the reserve still fits the budget (less context shown).
    long = "carcinom ductal invaziv " * 6
    ex = build_example(tok, Q, long, ctx, spec("qea", 120, reserve=10))
    assert len(ex["input_ids"]) == 120


@pytest.mark.parametrize("fmt", ["qea", "eqa"])
def test_labels_trimming_and_eos(tok, epicrisis, fmt):
    ctx = encode_context(tok, epicrisis)
    budget = 120
    assert len(ctx) > budget  # the epicrisis must be trimmed
    ex = build_example(tok, Q, A, ctx, spec(fmt, budget))
    ids, labels = ex["input_ids"], ex["labels"]
    assert len(ids) == len(labels) == budget  # fills the budget exactly, never more
    answer = tok.encode(" " + A, add_special_tokens=False)
    n_target = len(answer) + 1
    # Loss only on the answer and EOS; every prompt position is ignored.
    assert labels[-n_target:] == answer + [tok.eos_token_id]
    assert all(x == IGNORE_INDEX for x in labels[:-n_target])
    assert ids[-1] == tok.eos_token_id and ids[0] == tok.bos_token_id
    # Trimming keeps the HEAD of the epicrisis: its first tokens are in the prompt, in order.
    text = tok.decode(ids[:-n_target], skip_special_tokens=True)
    kept = tok.decode(ctx[:40]).strip()
    assert kept in text
    assert tok.decode(ctx[-20:]).strip() not in text
    assert text.endswith("Raspuns:") and (text.startswith("Intrebare:") if fmt == "qea"
                                          else text.startswith("Context:"))


def test_prompt_for_serving_reserves_room_and_budget_errors(tok, epicrisis):
    ctx = encode_context(tok, epicrisis)
    prompt = build_prompt_ids(tok, Q, ctx, spec("qea", 200, reserve=10))
    assert len(prompt) == 190
    with pytest.raises(BudgetError, match="context budget 12 tokens"):
        build_prompt_ids(tok, Q, ctx, spec("qea", 12))
    with pytest.raises(BudgetError):
        build_example(tok, Q, "un raspuns foarte lung " * 20, ctx, spec("qea", 40))


def test_check_budget_names_the_example(tok):
    import pandas as pd

    df = pd.DataFrame({"id": ["train:0", "train:1"], "question": [Q, Q * 10],
                       "answer": [A, A]})
    assert check_budget(tok, df.head(1), spec("qea", 64)) > 0
    with pytest.raises(BudgetError, match=r"prompt.context_tokens=64.*'train:1'"):
        check_budget(tok, df, spec("qea", 64))


def test_chunks_cover_the_whole_epicrisis_without_overlap(tok, epicrisis):
    ctx = encode_context(tok, epicrisis)
    exs = build_chunk_examples(tok, Q, A, ctx, spec("qea", 100))
    assert len(exs) > 1 and all(len(e["input_ids"]) <= 100 for e in exs)
    single = build_example(tok, Q, A, [], spec("qea", 100))
    fixed = len(single["input_ids"])
    assert sum(len(e["input_ids"]) - fixed for e in exs) == len(ctx)


def test_dynamic_padding_grouping_and_packing():
    from medray.train.collate import micro_batches, pack_rows

    rows = [{"input_ids": [5] * n, "labels": [IGNORE_INDEX] * (n - 1) + [7]}
            for n in (3, 9, 4, 8, 2, 7)]
    pad = list(micro_batches(rows, batch_size=2, pad_id=0, mode="pad"))
    assert [b["input_ids"].shape[1] for b in pad] == [9, 8, 7]  # longest in each batch
    assert sum(b["num_tokens"] for b in pad) == 33
    for b in pad:  # padding carries no loss and no attention
        assert ((b["attention_mask"] == 0) <= (b["labels"] == IGNORE_INDEX)).all()
    group = list(micro_batches(rows, batch_size=2, pad_id=0, mode="group", window=8))
    assert sorted(b["input_ids"].shape[1] for b in group) == [3, 7, 9]  # less padding
    assert sum(b["input_ids"].numel() for b in group) < sum(b["input_ids"].numel() for b in pad)
    bins = pack_rows(rows, max_len=10)
    assert all(sum(len(r["input_ids"]) for r in b) <= 10 for b in bins) and len(bins) == 4
    packed = list(micro_batches(rows, batch_size=4, pad_id=0, mode="pack", max_len=10,
                                window=8))
    assert sum(b["num_tokens"] for b in packed) == 33
    assert "attention_mask" not in packed[0]


def test_packed_rows_do_not_attend_across_examples(tiny_model, tok, epicrisis):
    """Logits of examples packed in one row equal their logits run one by one."""
    import torch

    from medray.models import load_model_and_tokenizer
    from medray.train.collate import model_inputs, packed_batch

    model, _ = load_model_and_tokenizer(str(tiny_model), "fp32")
    model.eval()
    ctx = encode_context(tok, epicrisis)
    a = build_example(tok, Q, A, ctx, spec("qea", 60))
    b = build_example(tok, "Care este stadiul?", "IIIB", ctx[30:], spec("eqa", 45))
    batch = packed_batch([[a, b]], pad_id=tok.pad_token_id)
    with torch.no_grad():
        packed = model(**model_inputs(batch), use_cache=False).logits[0]
        alone_a = model(input_ids=torch.tensor([a["input_ids"]])).logits[0]
        alone_b = model(input_ids=torch.tensor([b["input_ids"]])).logits[0]
    torch.testing.assert_close(packed[:60], alone_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed[60:105], alone_b, atol=1e-4, rtol=1e-4)


def test_prefix_rows_give_each_example_its_own_loss(tiny_model, tok, epicrisis):
    """One epicrisis, four questions: the prefix row computes the epicrisis once, and the
    summed answer loss (and its gradient) equals the examples' losses one by one."""
    import torch

    from medray.models import load_model_and_tokenizer
    from medray.train.collate import micro_batches, prefix_trees
    from medray.train.step import answer_loss

    model, _ = load_model_and_tokenizer(str(tiny_model), "fp32")
    ctx = encode_context(tok, epicrisis)
    qa = [(Q, A), ("Care este stadiul?", "IIIB"), ("Ce vârstă are pacienta?", "54 de ani"),
          ("Este fumătoare?", "Da")]
    rows = [build_example(tok, q, a, ctx, spec("eqa", 120)) for q, a in qa]
    other = build_example(tok, Q, A, encode_context(tok, "Alt pacient, alt text."),
                          spec("eqa", 120))
    trees = prefix_trees([*rows, other], max_tokens=10_000)
    assert sorted(len(t.tails) for t in trees) == [1, 4]  # the other patient shares nothing
    shared = next(t for t in trees if len(t.tails) == 4)
    assert len(shared.prefix_ids) > 64 and len(shared) < sum(len(r["input_ids"]) for r in rows)
    (batch,) = micro_batches(rows, batch_size=4, pad_id=tok.pad_token_id, mode="prefix",
                             max_len=10_000, window=8)
    assert batch["input_ids"].shape[0] == 1 and batch["attention_mask"].dim() == 4

    def loss_and_grad(batches: list) -> tuple[float, float, torch.Tensor]:
        model.zero_grad()
        total, n = torch.zeros(()), torch.zeros((), dtype=torch.long)
        for b in batches:
            s, k = answer_loss(model, b, torch.device("cpu"))
            total, n = total + s, n + k
        total.backward()
        grad = model.get_input_embeddings().weight.grad.clone()
        return float(total.detach()), int(n), grad

    together = loss_and_grad([batch])
    alone = loss_and_grad(list(micro_batches(rows, batch_size=1, pad_id=tok.pad_token_id)))
    assert together[1] == alone[1] > 4
    assert together[0] == pytest.approx(alone[0], rel=1e-4)
    torch.testing.assert_close(together[2], alone[2], atol=1e-5, rtol=1e-4)


def test_ray_data_pipeline_tokenises_each_epicrisis_once(ray_session, medqaro_prepared,
                                                         tiny_model, tok):
    from medray.data.prepared import load_prepared
    from medray.train.data import examples_dataset, tokenize_contexts

    data = load_prepared(medqaro_prepared)
    splits = ["train", "val"]
    wanted = set(data.examples[data.examples["split"].isin(splits)]["context_id"])
    assert wanted < set(data.contexts["context_id"])  # the test split's are never read
    # Forced onto the actor pool (a big cluster, no in-process threshold) ...
    contexts, how = tokenize_contexts(medqaro_prepared, str(tiny_model), splits,
                                      cluster_cpus=8, in_process_max_chars=0)
    assert how.startswith("by a Ray Data actor pool")
    assert set(contexts) == wanted  # one row per epicrisis the splits read
    cid = sorted(wanted)[0]
    assert contexts[cid].tolist() == encode_context(tok, data.context(cid))
    # ... and in-process (this 2-CPU session's default): the same table.
    local, how = tokenize_contexts(medqaro_prepared, str(tiny_model), splits,
                                   cluster_cpus=ray_session.cluster_resources()["CPU"])
    assert how == "in-process"
    assert set(local) == wanted
    assert all(local[c].tolist() == contexts[c].tolist() for c in wanted)
    ref = ray_session.put(contexts)
    val = data.split("val").sort_values("id")
    ids = val["id"].head(20).tolist()
    rows = examples_dataset(medqaro_prepared, "val", str(tiny_model), ref, spec("qea", 128),
                            ids=ids).take_all()
    assert sorted(r["id"] for r in rows) == sorted(ids)
    by_id = {r["id"]: r for r in rows}
    first = val.iloc[0]
    expected = build_example(tok, first.question, first.answer,
                             encode_context(tok, data.context(first.context_id)), spec("qea", 128))
    assert by_id[first.id]["input_ids"].tolist() == expected["input_ids"]
    assert by_id[first.id]["labels"].tolist() == expected["labels"]
    assert all(r["n_tokens"] <= 128 for r in rows)
