"""One training / validation micro-step, callable without Ray.

The Ray Train worker loop (medray.train.loop) and bench/gpu_check.py (a GPU machine
without Ray) call these same functions, so what the benchmark measures is what training
runs. `engine` is a DeepSpeed engine, or `TorchEngine` (the same slice of its API over a
plain torch optimiser) where DeepSpeed is not installed.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from medray.train.collate import model_inputs, useful_tokens
from medray.train.device import to_device


@dataclass
class StepResult:
    loss: Any  # detached scalar tensor on the worker's device (no host sync here)
    tokens: int  # non-padding tokens of the micro-batch
    boundary: bool  # this micro-batch completed an optimiser step


def train_step(engine: Any, batch: dict[str, Any], device: Any) -> StepResult:
    """Forward, backward and step on one micro-batch moved to `device`.

    The accumulation boundary is read from the engine BEFORE `step()`: DeepSpeed advances
    its micro-step counter inside `step()`, after which the answer is the next one's.
    """
    boundary = bool(engine.is_gradient_accumulation_boundary())
    summed, n = answer_loss(engine, batch, device)
    loss = summed / n
    engine.backward(loss)
    engine.step()
    return StepResult(loss=loss.detach(), tokens=useful_tokens(batch), boundary=boundary)


def eval_loss(engine: Any, batch: dict[str, Any], device: Any) -> tuple[Any, Any]:
    """(summed token loss, number of loss tokens) of one validation micro-batch."""
    summed, n = answer_loss(engine, batch, device)
    return summed.detach(), n


def answer_loss(engine: Any, batch: dict[str, Any], device: Any) -> tuple[Any, Any]:
    """(summed cross-entropy, number of target tokens) of a host-side micro-batch: the
    causal-LM loss the model's own `labels=` path computes (position t predicts label t+1;
    -100 ignored; fp32 logits), with the vocabulary projection run only where some row of
    the micro-batch has a target.

    Labels cover the answer alone, so the full projection would compute logits for the
    whole context and discard almost all of them: on a long epicrisis with a 128k vocabulary
    that is gigabytes of logits (and their gradient) per example. The positions are found on
    the host, so the device never waits on a data-dependent shape. A model whose forward has
    no `logits_to_keep` gets the full projection, sliced afterwards (same loss).
    """
    import torch

    keep = (batch["labels"][:, 1:] != -100).any(dim=0).nonzero().squeeze(1).to(device)
    inputs = to_device(model_inputs(batch), device)
    targets = inputs.pop("labels")[:, 1:]
    if _accepts_logits_to_keep(engine):
        logits = engine(**inputs, logits_to_keep=keep, use_cache=False).logits
    else:
        logits = engine(**inputs, use_cache=False).logits[:, keep]
    picked = targets[:, keep]
    summed = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), picked.reshape(-1),
        ignore_index=-100, reduction="sum")
    return summed, (picked != -100).sum()


def _accepts_logits_to_keep(engine: Any) -> bool:
    """Whether the causal LM under the engine's wrappers (DeepSpeed, PEFT) takes
    `logits_to_keep` (transformers' CausalLM classes do)."""
    model = getattr(engine, "module", engine)
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    return _forward_takes_logits_to_keep(type(model))


@functools.cache
def _forward_takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


class TorchEngine:
    """DeepSpeed's engine API as the training step uses it, over a torch optimiser.

    Same accumulation semantics: `backward` scales the loss by 1/grad_accum, `step` steps
    the optimiser (and scheduler) only at an accumulation boundary.
    """

    def __init__(self, module: Any, optimizer: Any, *, grad_accum: int = 1,
                 grad_clip: float = 0.0, scheduler: Any = None) -> None:
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler
        self.grad_accum, self.grad_clip = grad_accum, grad_clip
        self.micro_steps = self.global_steps = 0

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.grad_accum == 0

    def backward(self, loss: Any) -> None:
        (loss / self.grad_accum).backward()

    def step(self) -> None:
        import torch

        if self.is_gradient_accumulation_boundary():
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            if self.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.scheduler is not None:
                self.scheduler.step()
            self.global_steps += 1
        self.micro_steps += 1

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()
