"""The peer benches' own pieces on the real SmolLM2 tokenizer (no training, no vLLM):
bench/train_peer.py's reference examples are built as the MedQARo notebooks build them,
and bench/eval_peer.py hands lm-eval prompt texts that its vLLM model tokenises to
medray's own prompt ids."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def peers():
    sys.path.insert(0, str(BENCH))
    try:
        import eval_peer
        import train_peer

        yield train_peer, eval_peer
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def long_data(tmp_path_factory, peers):
    return peers[0].synth_data(tmp_path_factory.mktemp("peer-train"), 1)


def test_reference_examples_trim_pad_and_label_every_position(smollm2_model, long_data,
                                                              peers):
    from transformers import AutoTokenizer

    from medray.data.prepared import load_prepared

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    data = load_prepared(long_data)
    rows = data.split("train").sort_values("id").head(3).to_dict("records")
    contexts = dict(zip(data.contexts["context_id"], data.contexts["text"], strict=True))
    for budget in (256, 512):
        examples = peers[0].reference_examples(tok, rows, contexts, budget)
        for r, ex in zip(rows, examples, strict=True):
            assert len(ex["input_ids"]) == budget  # padded to N
            assert ex["labels"] == ex["input_ids"]  # loss on every position, pads too
            assert ex["input_ids"][ex["useful"]:] == [tok.pad_token_id] * (budget - ex["useful"])
            text = tok.decode(ex["input_ids"][:ex["useful"]])
            assert text.startswith(f"Intrebare: {r['question']} Context: ")
            assert text.endswith(f" Raspuns: {r['answer']}")
            # the epicrisis is long: trimmed to N-100 tokens, so the example stops short of N
            context = text.split(" Context: ", 1)[1].rsplit(" Raspuns:", 1)[0]
            assert budget - 110 < len(tok.encode(context)) <= budget - 100 + 2
            assert budget - 100 < ex["useful"] < budget
            assert 0 < ex["answer"] <= len(tok.encode(" " + r["answer"])) + 1


def test_eval_peer_prompt_text_is_medray_prompt_ids(smollm2_model, tmp_path, peers):
    eval_peer = peers[1]
    docs = eval_peer.rendered(str(smollm2_model), eval_peer.synth_data(tmp_path), 30, 640)
    from transformers import AutoTokenizer

    vllm_model = eval_peer.lm_eval_vllm_class()
    lm = vllm_model.__new__(vllm_model)  # its tokeniser path only: no engine
    lm.tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    lm.custom_prefix_token_id, lm.add_bos_token = None, None
    assert len(docs) == 30
    for d in docs:
        assert d["prompt"].startswith("<|im_start|>system\n")  # the chat template, no BOS
        assert d["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n")
    # a text can only carry whole characters: a trim that cut one in half cannot round-trip
    whole = [d for d in docs if "\ufffd" not in d["prompt"]]
    assert whole
    assert all(lm.tok_encode(d["prompt"]) == d["ids"] for d in whole)
