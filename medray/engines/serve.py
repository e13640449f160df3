"""Client engine for medray's own Serve app (medray/serve/app.py): over HTTP (`url`), or,
from inside the Ray cluster that serves it, through a DeploymentHandle (`app`: the
application's name; medray/engines/serve_handle.py), which skips the HTTP proxy.

`generate` and `score_options` use the OpenAI-compatible /v1/completions route (log-probs
of generated tokens; prompt log-probs for option scoring; HTTP only); `qa`, `qa_batch` (one
patient's questions in one call) and `mcq` call the QA routes, where the long-context
strategy runs server-side with the training prompt code; `models` reads /v1/models (each
served name's prompt and whether it takes images). `mcq` sends an item's images as data
URLs; whether the served model takes them is its /v1/models card's `images` (`served_card`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import httpx

from medray.engines.base import Generation, OptionScore

# Questions per /v1/qa/batch call: the serve config's default max_questions, so a patient
# with more questions (rare) takes several calls.
QA_BATCH = 64


class ServeError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body

    def __reduce__(self):  # picklable, so it crosses Ray actor boundaries intact
        return (ServeError, (self.status, self.body))


class ServeEngine:
    name = "serve"

    def __init__(
        self,
        url: str | None,
        *,
        app: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "MEDRAY_API_KEY",
        model: str = "medray",
        adapter: str | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.model = model
        self.adapter = adapter
        self._app = None
        if app:  # in-cluster: no key (being in the cluster is the credential)
            from medray.engines.serve_handle import AppHandle

            self._app = AppHandle(app, timeout)
        self._client = None
        if self.url:
            key = api_key or os.environ.get(api_key_env)
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _post(self, path: str, payload: dict[str, Any] | None, get: bool = False) -> Any:
        from medray.engines.serve_handle import IN_CLUSTER_ROUTES

        if self._app is not None and path in IN_CLUSTER_ROUTES:
            status, body = self._app.call(path, payload or {})
            if status >= 400:
                raise ServeError(status, json.dumps(body))
            return body
        if self._client is None:
            raise ServeError(404, f"{path} is not called in-cluster (engine.app "
                             f"{self._app and self._app.app!r}); set engine.url to reach it")
        resp = self._client.get(path) if get else self._client.post(path, json=payload)
        if resp.status_code >= 400:
            raise ServeError(resp.status_code, resp.text)
        return resp.json()

    def _model_field(self) -> str:
        return f"{self.model}:{self.adapter}" if self.adapter else self.model

    @property
    def supports_images(self) -> bool:
        """The served model is a vision-language model (its /v1/models card says so)."""
        return bool((served_card(self.models(), self.model, self.adapter) or {}).get("images"))

    # ------------------------------------------------------------------ Engine protocol
    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 0.0
    ) -> list[Generation]:
        data = self._post("/v1/completions", {
            "model": self._model_field(), "prompt": list(prompts), "max_tokens": max_new_tokens,
            "temperature": temperature, "logprobs": 1, "return_token_ids": True,
        })
        usage = data.get("usage") or {}
        out = []
        for choice in sorted(data["choices"], key=lambda c: c["index"]):
            lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
            out.append(Generation(
                text=choice["text"], token_ids=list(choice.get("token_ids") or []),
                logprobs=[float(x) for x in lps if x is not None],
                prompt_tokens=len(choice.get("prompt_token_ids") or [])
                or int(usage.get("prompt_tokens", 0)) // max(len(prompts), 1),
                raw=choice["text"],
            ))
        return out

    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        """Prompt log-probs of prompt+continuation; the continuation's tokens are the tail
        that differs from the prompt's own tokenisation."""
        base = self._post("/v1/completions", {
            "model": self._model_field(), "prompt": prompt, "max_tokens": 1,
            "return_token_ids": True,
        })["choices"][0]["prompt_token_ids"]
        scores = []
        for cont in continuations:
            choice = self._post("/v1/completions", {
                "model": self._model_field(), "prompt": prompt + cont, "max_tokens": 1,
                "prompt_logprobs": 0, "return_token_ids": True,
            })["choices"][0]
            ids, plp = choice["prompt_token_ids"], choice["prompt_logprobs"]
            start = next((i for i, (a, b) in enumerate(zip(ids, base, strict=False)) if a != b),
                         min(len(ids), len(base)))
            total = sum(float(plp[i][str(ids[i])]["logprob"]) for i in range(start, len(ids)))
            scores.append(OptionScore(total, len(ids) - start, len(cont)))
        return scores

    # ------------------------------------------------------------------ QA routes
    def qa(self, question: str, context: str, **options: Any) -> dict[str, Any]:
        payload = {"question": question, "context": context, "adapter": self.adapter}
        payload.update({k: v for k, v in options.items() if v is not None})
        return self._post("/v1/qa", payload)

    def qa_batch(self, questions: Sequence[str], context: str,
                 **options: Any) -> list[dict[str, Any]]:
        """One patient's questions over their shared record in one /v1/qa/batch call (at
        most QA_BATCH; more go in several calls): each answer is /v1/qa's for it."""
        out: list[dict[str, Any]] = []
        for i in range(0, len(questions), QA_BATCH):
            payload = {"questions": list(questions[i:i + QA_BATCH]), "context": context,
                       "adapter": self.adapter}
            payload.update({k: v for k, v in options.items() if v is not None})
            out += self._post("/v1/qa/batch", payload)["answers"]
        return out

    def mcq(self, item: dict[str, Any], shots: Sequence[dict] = (),
            max_new_tokens: int | None = None) -> dict[str, Any]:
        """One prepared multiple-choice item through /v1/mcq (its dataset's prompt)."""
        from medray.data.registry import dataset_spec
        from medray.prompts.text import question_id

        payload: dict[str, Any] = {
            "question": item["question"], "kind": item["kind"], "dataset": item["dataset"],
            "options": [{"label": o["label"], "text": o["text"]} for o in item["options"]],
            "shots": [{"question": s["question"], "answer": list(s["answer"]),
                       "options": [{"label": o["label"], "text": o["text"]}
                                   for o in s["options"]]} for s in shots],
            "adapter": self.adapter}
        if dataset_spec(item["dataset"]).id_prefix:
            payload["question_id"] = question_id(item)
        if item.get("images"):
            payload["images"] = image_urls(item)
        if max_new_tokens is not None:
            payload["max_new_tokens"] = max_new_tokens
        return self._post("/v1/mcq", payload)

    def models(self) -> dict[str, Any]:
        """/v1/models: the served names, each with its prompt."""
        return self._post("/v1/models", None, get=True)

    def healthy(self) -> bool:
        if self._client is None:  # in-cluster: the handle found the app callable
            return self._app is not None
        try:
            return self._client.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def served_card(models: dict[str, Any], name: str, adapter: str | None = None) -> dict | None:
    """The /v1/models card (a body of that route) of served `name` (with `adapter`: the
    adapter's card, named "NAME:ADAPTER" or just "ADAPTER")."""
    wanted = {f"{name}:{adapter}", adapter} if adapter else {name}
    return next((c for c in models.get("data", []) if c.get("id") in wanted), None)


def image_urls(item: dict[str, Any]) -> list[str]:
    """A prepared item's images as data URLs, each re-checked before it is read (inside the
    item's image root, a real image, under the size cap)."""
    from medray.engines.api import image_b64
    from medray.prompts.text import meta_dict

    root = meta_dict(item.get("meta")).get("image_root")
    return ["data:{};base64,{}".format(*image_b64(path, root)) for path in item["images"]]
