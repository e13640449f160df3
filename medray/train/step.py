"""One training / validation micro-step, callable without Ray.

The Ray Train worker loop (medray.train.loop) and bench/gpu_check.py (a GPU machine
without Ray) call these same functions, so what the benchmark measures is what training
runs. `engine` is a DeepSpeed engine, or `TorchEngine` (the same slice of its API over a
plain torch optimiser) where DeepSpeed is not installed.
"""

from __future__ import annotations

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
    inputs = to_device(model_inputs(batch), device)
    boundary = bool(engine.is_gradient_accumulation_boundary())
    out = engine(**inputs, use_cache=False)
    engine.backward(out.loss)
    engine.step()
    return StepResult(loss=out.loss.detach(), tokens=useful_tokens(batch), boundary=boundary)


def eval_loss(engine: Any, batch: dict[str, Any], device: Any) -> tuple[Any, Any]:
    """(summed token loss, number of loss tokens) of one validation micro-batch."""
    inputs = to_device(model_inputs(batch), device)
    n = (inputs["labels"][:, 1:] != -100).sum()
    out = engine(**inputs, use_cache=False)
    return out.loss.detach() * n, n


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
