"""`medray eval`: the evaluation run, validated with pydantic. `--config X.yaml` reads it;
`--engine KIND:TARGET --data DIR` builds the same config from flags (`engine_config`).

Example (served model; `MEDRAY_API_KEY` holds the bearer key)::

    data: runs/demo/data            # prepared dataset directory
    split: test                     # test | test_cross | val
    engine: {kind: serve, url: "http://127.0.0.1:8000", adapter: ft}
    #engine: {kind: serve, app: medray, adapter: ft}  # in the app's Ray cluster: no HTTP
    #engine: {kind: vllm, model: runs/demo/model, adapter: runs/demo/train/adapter}
    #engine: {kind: vllm, model: M, device: gpu, tensor_parallel_size: 2,
    #         gpu_memory_utilization: 0.9, enable_prefix_caching: true}  # 2 GPUs per actor
    #engine: {kind: baseline, baseline: random-token, tokens: 1024, seed: 0}
    #engine: {kind: hf, model: runs/demo/model}           # in-process transformers
    #engine: {kind: openai, model: gpt-4o-mini}           # also anthropic (API key in env)
    # prompt: as the model was trained (its prompt.json) unless set here, e.g.
    #prompt: {context_tokens: 1024, strategy: chunks}   # trim | chunks | retrieve
    #prompt: {shots: 3}             # multiple choice: in-context examples per kind
    actors: 2
    max_in_flight: 8
    score: {modes: [medqaro, robust], by: [question_type, cancer_type], resamples: 1000}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from medray.config import Strict, load_yaml
from medray.engines.registry import EngineSpec, parse_spec
from medray.prompts.spec import PromptOverride, PromptSpec, moved_prompt_keys
from medray.tracking import TrackingConfig

__all__ = ["EngineSpec", "EvalConfig", "ScoreSpec", "engine_config", "load_eval_config"]


class ScoreSpec(Strict):
    modes: list[Literal["medqaro", "robust"]] = ["medqaro"]
    by: list[str] = Field(default_factory=list)  # e.g. question_type, cancer_type
    resamples: int = Field(1000, ge=0)
    seed: int = 0
    wordnet: bool = True


class EvalConfig(Strict):
    data: Path
    split: str = "test"
    engine: EngineSpec
    # None: as the evaluated model was trained (the prompt.json beside its adapter or
    # merged model; for `serve`, what the endpoint reports); fields set here override it.
    # Multiple choice: `shots` per kind; each item's budget is its dataset's minimal one
    # unless `max_new_tokens` is set here.
    prompt: PromptOverride | None = None
    group_as_multiple: bool = False  # ask group items as multiple choice over statements
    loglik: bool | None = None  # MCQ option log-likelihood; None: engines that score options
    sample: int | None = Field(None, ge=1)  # seeded random subset of N items (the papers')
    seed: int = 0  # seed of `sample` and of the shots
    limit: int | None = Field(None, ge=1)  # first N items of the split (smoke runs)
    allow_external_api: bool = False  # clinical text to an external provider (opt-in)
    cache: Path | None = None  # API response cache (default: see medray.eval.plan)
    # None: one actor for a model on CPU (each actor holds its own copy, so one actor with
    # all the cores beats two with half each), two otherwise
    actors: int | None = Field(None, ge=1)
    max_in_flight: int = Field(4, ge=1)  # requests outstanding across all actors
    # SPREAD: the actors go to different nodes where Ray can (one node: no difference)
    actor_placement: Literal["SPREAD", "DEFAULT"] = "SPREAD"
    fine_tuned: bool | None = None  # for the report's "fine-tuned" column
    score: ScoreSpec = Field(default_factory=ScoreSpec)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)  # MLflow / W&B; off

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, raw: Any) -> Any:
        moved = moved_prompt_keys(raw, ("prompt_format", "context_tokens", "strategy",
                                        "max_new_tokens"))
        if moved:
            raise ValueError("; ".join(moved))
        return raw

    @property
    def actor_count(self) -> int:
        """`actors`, else one for a model on CPU and two otherwise."""
        return self.actors or (1 if self.engine.runs_on_cpu else 2)


# Settings that change how the run is executed, not what it computes: a resume may change
# them (more actors, a larger rate limit) without mixing two runs in one folder.
# engine.app: whether the same served model is called in-cluster or over HTTP.
EXECUTION_ONLY = ("actors", "max_in_flight", "actor_placement", "cache", "engine.concurrency",
                  "engine.requests_per_minute", "engine.max_retries", "engine.timeout_s",
                  "engine.cpus", "engine.app", "tracking")


def engine_config(engine: str, data: str | Path, *, base_url: str | None = None,
                  api_key_env: str | None = None, concurrency: int = 4,
                  requests_per_minute: float | None = None, max_retries: int = 5,
                  timeout: float = 60.0, params: dict[str, Any] | None = None,
                  seed: int = 0, **fields: Any) -> EvalConfig:
    """The config `medray eval --engine KIND:TARGET --data DIR ...` stands for. Raises
    EngineSpecError or ValueError (naming the option) on a bad combination."""
    extra = {"base_url": base_url, "concurrency": concurrency,
             "requests_per_minute": requests_per_minute, "max_retries": max_retries,
             "params": params or {}}
    spec = parse_spec(engine, api_key_env=api_key_env,
                      **{k: v for k, v in extra.items() if v is not None})
    if spec.external:  # the SDK request timeout; Serve and local engines keep theirs
        spec = spec.model_copy(update={"timeout_s": timeout})
    by = ["question_type"]
    if (Path(data) / "manifest.json").is_file():
        import json

        if json.loads((Path(data) / "manifest.json").read_text()).get("kind") == "mcq":
            by = ["language", "modality"]
    prompt: dict[str, Any] = {}  # only what the flags set: the rest stays the model's own
    if shots := fields.pop("shots", 0):
        prompt["shots"] = shots
    if (chat_template := fields.pop("chat_template", None)) is not None:
        prompt["chat_template"] = chat_template
    try:
        if prompt:
            fields["prompt"] = PromptSpec(**prompt)
        return EvalConfig(data=Path(data), engine=spec, seed=seed,
                          score=ScoreSpec(modes=["medqaro"], by=by, seed=seed), **fields)
    except ValidationError as err:
        raise ValueError("; ".join(f"--{'-'.join(map(str, e['loc'])) or 'shots'}: {e['msg']}"
                                   for e in err.errors())) from None


def load_eval_config(path: str | Path) -> EvalConfig:
    """Read and validate (medray.config: errors name the file and the key); a relative
    `data` that does not exist from here is taken relative to the file."""
    path = Path(path)
    cfg = load_yaml(EvalConfig, path, what="eval config")
    if not cfg.data.is_absolute() and not cfg.data.exists():
        cfg.data = (path.parent / cfg.data).resolve()
    return cfg
