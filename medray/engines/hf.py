"""The transformers Engine: greedy generation with per-token log-probs, option scoring.

Used for validation answers during training (on the live, possibly ZeRO-3 sharded model)
and as the fallback engine where vLLM is not available. A vision-language model (by path or
hub id) is loaded with its processor and also takes each prompt's images.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medray.engines.base import Generation, OptionScore


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model: str | Any,
        *,
        tokenizer: Any = None,
        adapter: str | None = None,
        dtype: str = "fp32",
        device: str | None = None,
        batch_size: int = 8,
        synced_gpus: bool = False,
    ) -> None:
        """`model` is a path / hub id, or an already-loaded model (then pass `tokenizer`)."""
        import torch

        from medray.models import load_model_and_tokenizer, load_tokenizer
        from medray.models.vision import is_vision_model

        self.processor: Any = None
        self.supports_images = isinstance(model, str) and is_vision_model(model)
        if self.supports_images:
            from medray.models.vision import image_token, load_vision_model

            self.model_name = str(model)
            self.lm, self.tokenizer, self.processor = load_vision_model(self.model_name, dtype)
            self.image_token = image_token(self.processor)
            if adapter:
                from peft import PeftModel

                self.lm = PeftModel.from_pretrained(self.lm, adapter)
        elif isinstance(model, str):
            self.model_name = model
            self.lm, self.tokenizer = load_model_and_tokenizer(model, dtype)
            if adapter:
                from peft import PeftModel

                self.lm = PeftModel.from_pretrained(self.lm, adapter)
        else:
            self.lm = model
            self.model_name = getattr(getattr(model, "config", None), "_name_or_path", "model")
            self.tokenizer = tokenizer or load_tokenizer(self.model_name)
        self.model = self.model_name
        self.adapter = adapter
        self.device = torch.device(device) if device else next(self.lm.parameters()).device
        if isinstance(model, str):
            self.lm.to(self.device)
        self.batch_size = batch_size
        # ZeRO-3: every rank must run the same number of forward passes.
        self.synced_gpus = synced_gpus

    # ------------------------------------------------------------------ generation

    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 0.0,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[Generation]:
        """`images`: each prompt's PIL images (a vision-language model only); a prompt with
        images is run on its own, through the model's processor."""
        ids = [self.tokenizer.encode(p, add_special_tokens=True) for p in prompts]
        if not images or not any(images):
            return self.generate_ids(ids, max_new_tokens=max_new_tokens,
                                     temperature=temperature)
        if not self.supports_images:
            raise ValueError(f"{self.model_name} is a text-only model: it takes no images")
        out: list[Generation | None] = [None] * len(prompts)
        text = [i for i in range(len(prompts)) if i >= len(images) or not images[i]]
        gens = self.generate_ids([ids[i] for i in text], max_new_tokens=max_new_tokens,
                                 temperature=temperature) if text else []
        for i, gen in zip(text, gens, strict=True):
            out[i] = gen
        for i, item_images in enumerate(images):
            if item_images:
                enc = self.processor(text=[prompts[i]], images=[list(item_images)],
                                     return_tensors="pt")
                n = int(enc["input_ids"].shape[1])
                out[i] = self._run(dict(enc), [n], n, max_new_tokens, temperature)[0]
        return [g for g in out if g is not None]

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
        temperature: float = 0.0,
    ) -> list[Generation]:
        """Generate from token ids (the training-side trimmed prompts); new tokens only."""
        out: list[Generation] = []
        for i in range(0, len(prompt_ids), self.batch_size):
            out += self._generate_batch(prompt_ids[i:i + self.batch_size], max_new_tokens,
                                        temperature)
        return out

    def _generate_batch(self, batch: Sequence[Sequence[int]], max_new_tokens: int,
                        temperature: float) -> list[Generation]:
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(x) for x in batch)
        # Left padding: every prompt ends at the same column, new tokens follow.
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, x in enumerate(batch):
            ids[r, width - len(x):] = torch.tensor(list(x), dtype=torch.long)
            mask[r, width - len(x):] = 1
        return self._run({"input_ids": ids, "attention_mask": mask}, [len(x) for x in batch],
                         width, max_new_tokens, temperature)

    def _run(self, inputs: dict[str, Any], lengths: list[int], width: int,
             max_new_tokens: int, temperature: float) -> list[Generation]:
        """Generate from model inputs whose prompts end at column `width`; new tokens only."""
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        kwargs: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        was_training = self.lm.training
        self.lm.eval()
        with torch.no_grad():
            res = self.lm.generate(
                **{k: v.to(self.device) for k, v in inputs.items()},
                max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=tok.eos_token_id,
                output_scores=True, return_dict_in_generate=True, synced_gpus=self.synced_gpus,
                **kwargs,
            )
        if was_training:
            self.lm.train()
        new = res.sequences[:, width:].cpu()
        # Log-probs of the chosen tokens under the unmodified distribution.
        steps = torch.stack([s.float().log_softmax(-1).cpu() for s in res.scores], dim=1)
        chosen = steps.gather(-1, new[:, : steps.shape[1], None]).squeeze(-1)
        gens = []
        for r, length in enumerate(lengths):
            toks = new[r].tolist()
            n = len(toks)
            if tok.eos_token_id in toks:  # keep tokens up to (not incl.) EOS
                n = toks.index(tok.eos_token_id)
            elif pad != tok.eos_token_id and pad in toks:
                n = toks.index(pad)
            text = tok.decode(toks[:n], skip_special_tokens=True).strip()
            gens.append(Generation(text=text, token_ids=toks[:n],
                                   logprobs=chosen[r, :n].tolist(), prompt_tokens=length))
        return gens

    # ---------------------------------------------------------------- option scoring

    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        """Sum log-prob of each continuation given the prompt (lm-eval style split)."""
        import torch

        tok = self.tokenizer
        ctx = tok.encode(prompt, add_special_tokens=True)
        scores = []
        self.lm.eval()
        for cont in continuations:
            whole = tok.encode(prompt + cont, add_special_tokens=True)
            # The continuation is what the whole encoding adds beyond the prompt's ids.
            n_ctx = len(ctx) if whole[: len(ctx)] == ctx else _common_prefix(whole, ctx)
            n_ctx = min(n_ctx, len(whole) - 1) if len(whole) > 1 else 0
            ids = torch.tensor([whole], device=self.device)
            with torch.no_grad():
                logits = self.lm(input_ids=ids).logits[0].float()
            logp = logits[:-1].log_softmax(-1)
            target = ids[0, 1:]
            token_lp = logp.gather(-1, target[:, None]).squeeze(-1)[max(n_ctx - 1, 0):]
            scores.append(OptionScore(logprob=float(token_lp.sum()), n_tokens=len(token_lp),
                                      n_chars=len(cont)))
        return scores


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
