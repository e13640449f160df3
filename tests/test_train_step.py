"""The training step's loss: the vocabulary projection only where there are targets, and
the same loss and gradients as the model's own `labels=` path (no Ray: seconds)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _tiny_llama(tie: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).float()


def _batch():
    """Right-padded rows of different lengths; labels only on each row's tail (the answer)."""
    from medray.train.collate import pad_batch

    g = torch.Generator().manual_seed(1)
    rows = []
    for length, answer in [(20, 3), (13, 4), (17, 2)]:
        ids = torch.randint(1, 96, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (length - answer) + ids[-answer:]})
    return pad_batch(rows, pad_id=0)


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (some remote-code models)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls: list[dict] = []

    def forward(self, input_ids=None, attention_mask=None, use_cache=False):
        self.calls.append({"input_ids": input_ids})
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=use_cache)


@pytest.mark.parametrize("wrapped", [False, True], ids=["logits_to_keep", "full-then-slice"])
def test_answer_loss_equals_the_models_own_loss_and_gradients(wrapped):
    from medray.train.collate import model_inputs
    from medray.train.step import TorchEngine, answer_loss

    batch = _batch()
    reference = _tiny_llama()
    ref = reference(**model_inputs(batch), use_cache=False).loss
    ref.backward()

    model = _tiny_llama()
    module = _NoLogitsToKeep(model) if wrapped else model
    engine = TorchEngine(module, torch.optim.SGD(model.parameters(), lr=0.0))
    summed, n = answer_loss(engine, batch, torch.device("cpu"))
    assert int(n) == 3 + 4 + 2  # each row's answer tokens (the first label has no predictor)
    loss = summed / n
    loss.backward()
    assert torch.allclose(loss, ref, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_only_positions_with_a_target_reach_the_vocabulary_projection():
    from medray.train.step import TorchEngine, answer_loss

    model = _tiny_llama()
    seen: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    answer_loss(TorchEngine(model, torch.optim.SGD(model.parameters(), lr=0.0)), _batch(),
                torch.device("cpu"))
    # positions t with labels[:, t+1] set in some row: rows end at 20, 13, 17 with answers of
    # 3, 4, 2 tokens -> t in {16..18} U {8..11} U {14, 15} = 9 positions of the 20
    assert seen == [(3, 9, 32)]


def test_train_step_steps_the_optimiser_on_the_answer_loss():
    from medray.train.step import TorchEngine, train_step

    model = _tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    engine = TorchEngine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    res = train_step(engine, _batch(), torch.device("cpu"))
    assert res.boundary and res.tokens == 20 + 13 + 17 and float(res.loss) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
