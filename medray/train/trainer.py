"""Driver side of training: validate, tokenise once, build the TorchTrainer, export.

`run_training(cfg, output)` does, in order:
1. validate everything cheap before any worker starts (config keys were checked by
   pydantic; here: model path, LoRA targets on a weightless meta model, data dir,
   context budget vs question + answer);
2. tokenise each epicrisis once (in-process, or a Ray Data actor pool for much text on a
   big enough cluster) and share the table;
3. stream the assembled examples to a Ray Train V2 TorchTrainer (DeepSpeed + PEFT);
4. export the best (or last) checkpoint's adapter to OUTPUT/adapter and write
   OUTPUT/metrics.json (per-epoch losses, F1/EM, tokens/s, the resolved config).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from medray.train.config import ConfigError, TrainConfig
from medray.train.plan import Preflight, RunPlan, schedule

MEDQARO_METRIC_NOTE = (
    "val_f1/val_em: metric mode 'medqaro' (reference formulas), greedy decoding, "
    "max_new_tokens from prompt.max_new_tokens, on the first data.val_generate_examples "
    "examples of the validation split (sorted by id); val_loss: token-weighted "
    "cross-entropy over answer+EOS tokens of the validation split"
)


MCQ_METRIC_NOTE = (
    "val_accuracy: greedy reply read by the evaluation's extractor, correct when conforming "
    "and the exact set of key letters (all-correct rule; non-conforming counted wrong), on "
    "the first data.val_generate_examples validation items (sorted by id), per kind as "
    "val_accuracy_<kind>; val_conforming: conforming share; val_loss: token-weighted "
    "cross-entropy over the key letters + EOS of the validation split"
)


def preflight(cfg: TrainConfig) -> Preflight:
    """Every check that can fail before workers start; returns the run plan."""
    from medray.data.prepared import load_prepared
    from medray.models import (
        LoraTargetError,
        check_attn_implementation,
        check_lora_targets,
        load_tokenizer,
        meta_model,
    )
    from medray.prompts.tokens import answer_ids, check_budget, prompt_pieces

    # Workers do not share the driver's working directory: make local paths absolute.
    if Path(cfg.model.name_or_path).exists():
        cfg.model.name_or_path = str(Path(cfg.model.name_or_path).resolve())
    if Path(cfg.data.path).exists():
        cfg.data.path = str(Path(cfg.data.path).resolve())
    try:
        check_attn_implementation(cfg.model.attn_implementation)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    model = meta_model(cfg.model.name_or_path, cfg.model.trust_remote_code)
    targets = check_lora_targets(model, cfg.lora.target_modules)
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    unknown = [m for m in cfg.lora.modules_to_save if m not in names]
    if unknown:
        raise LoraTargetError(f"lora.modules_to_save {unknown} match no module of "
                              f"{type(model).__name__}")
    del model
    data_dir = Path(cfg.data.path)
    if not (data_dir / "manifest.json").is_file():
        raise FileNotFoundError(f"data.path {str(data_dir)!r}: not a prepared dataset "
                                "(no manifest.json); run `medray data prepare` first")
    data = load_prepared(data_dir)
    if data.kind == "generative" and data.contexts is None:
        raise ValueError(f"data.path {str(data_dir)!r}: generative training needs the "
                         f"epicrises (contexts table); {data.dataset} has none")
    for split in (cfg.data.train_split, cfg.data.val_split):
        if split not in data.manifest["splits"]:
            raise ValueError(f"data split {split!r} not in {sorted(data.manifest['splits'])}")
    tokenizer = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    train, val = _selected(cfg, data)
    spec = cfg.prompt  # reserve = max_new_tokens: training prompts = served prompts
    common = {"lora_targets": targets, "n_train": len(train), "n_val": len(val),
              "train_ids": train["id"].tolist() if cfg.data.max_train_examples else None,
              "val_ids": val["id"].tolist() if cfg.data.max_val_examples else None,
              "val_gen_ids": val["id"].tolist()[: cfg.data.val_generate_examples]}
    if data.kind == "mcq":
        from medray.train import mcq

        for split, items in ((cfg.data.train_split, train), (cfg.data.val_split, val)):
            mcq.check_items(items, split, f"data.path {str(data_dir)!r}")
        mcq.examples_frame(tokenizer, val, spec)  # every budget error before workers start
        lengths = mcq.examples_frame(tokenizer, train, spec)["n_tokens"].tolist()
        return Preflight(**common, train_rooms=[], train_context_ids=[], kind="mcq",
                         train_lengths=lengths)
    check_budget(tokenizer, train, spec)
    check_budget(tokenizer, val, spec)

    # Each example's context room: the schedule is sized from them once the epicrises
    # are tokenised (see schedule()).
    rooms = [spec.context_room(prompt_pieces(tokenizer, r.question, spec),
                               len(answer_ids(tokenizer, r.answer, spec)))
             for r in train.itertuples(index=False)]
    return Preflight(**common, train_rooms=rooms,
                     train_context_ids=train["context_id"].tolist())


def _selected(cfg: TrainConfig, data: Any) -> tuple[Any, Any]:
    """The train and validation items of the run, sorted by id (data.max_*_examples)."""
    train = data.split(cfg.data.train_split).sort_values("id")
    val = data.split(cfg.data.val_split).sort_values("id")
    if cfg.data.max_train_examples:
        train = train.head(cfg.data.max_train_examples)
    if cfg.data.max_val_examples:
        val = val.head(cfg.data.max_val_examples)
    return train, val


def _val_generate_items(cfg: TrainConfig, ids: list[str], contexts: dict) -> list[dict]:
    """The fixed validation subset: trimmed prompt ids (same code as serving) + answer."""
    from medray.data.prepared import load_prepared
    from medray.models import load_tokenizer
    from medray.prompts.tokens import build_prompt_ids

    if not ids:
        return []
    tokenizer = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    ex = load_prepared(cfg.data.path).examples.set_index("id").loc[ids]
    return [
        {"id": i, "answer": r.answer,
         "prompt_ids": build_prompt_ids(tokenizer, r.question, contexts[r.context_id].tolist(),
                                        cfg.prompt)}
        for i, r in zip(ex.index, ex.itertuples(index=False), strict=True)
    ]


def checkpoint_storage(cfg: TrainConfig, output: Path) -> str:
    """checkpoint.storage_path (a shared folder or a URI), else OUTPUT/ray."""
    where = cfg.checkpoint.storage_path
    if where and "://" in where:
        return where
    return str(Path(where).resolve() if where else (output / "ray").resolve())


def build_trainer(cfg: TrainConfig, output: Path, plan: RunPlan, datasets: dict[str, Any],
                  callbacks: Sequence[Any] = ()) -> Any:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from medray.train.device import torch_backend
    from medray.train.loop import train_loop_per_worker

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": cfg.model_dump(mode="json"), "plan": plan},
        torch_config=TorchConfig(backend=torch_backend(cfg.scaling.use_gpu)),
        scaling_config=ScalingConfig(
            num_workers=cfg.scaling.num_workers, use_gpu=cfg.scaling.use_gpu,
            resources_per_worker={"CPU": cfg.scaling.cpus_per_worker,
                                  **({"GPU": 1} if cfg.scaling.use_gpu else {})},
            placement_strategy=cfg.scaling.placement_strategy),
        run_config=RunConfig(
            name=cfg.name,
            storage_path=checkpoint_storage(cfg, output),
            failure_config=FailureConfig(max_failures=cfg.fault.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.checkpoint.num_to_keep,
                checkpoint_score_attribute=cfg.checkpoint.metric,
                checkpoint_score_order=cfg.checkpoint.mode),
            # Two malloc arenas: with glibc's default (8 per core) a CPU worker training on
            # rows of varying length keeps gigabytes of freed activation memory (measured on
            # SmolLM2's 1,024-token rows), at the same step time.
            worker_runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false",
                                             "MALLOC_ARENA_MAX": "2"}},
            callbacks=list(callbacks),
        ),
        datasets=datasets,
    )


def _datasets(cfg: TrainConfig, plan: RunPlan, contexts: dict,
              contexts_ref: Any) -> dict[str, Any]:
    """train: streamed from the Ray Data actor pipeline; val: small, assembled here once."""
    import ray

    from medray.data.prepared import load_prepared
    from medray.train.data import ExampleAssembler, examples_dataset

    train = examples_dataset(cfg.data.path, cfg.data.train_split, cfg.model.name_or_path,
                             contexts_ref, cfg.prompt, ids=plan.train_ids)
    # Validation runs every epoch; building it once avoids re-spawning the pipeline.
    val = load_prepared(cfg.data.path).split(cfg.data.val_split).sort_values("id")
    if plan.val_ids is not None:
        val = val[val["id"].isin(set(plan.val_ids))]
    assembler = ExampleAssembler(cfg.model.name_or_path, contexts, cfg.prompt)
    return {"train": train, "val": ray.data.from_pandas(assembler(val))}


def _mcq_datasets(cfg: TrainConfig, checked: Preflight) -> tuple[dict[str, Any], list[dict]]:
    """Multiple choice: a few thousand short items, assembled here once (no epicrises to
    share), handed to Ray Data for the workers' shards; and the greedy validation subset."""
    import ray

    from medray.data.prepared import load_prepared
    from medray.models import load_tokenizer
    from medray.train import mcq

    tokenizer = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    train, val = _selected(cfg, load_prepared(cfg.data.path))
    frames = {name: mcq.examples_frame(tokenizer, items, cfg.prompt)
              for name, items in (("train", train), ("val", val))}
    generate = val[val["id"].isin(set(checked.val_gen_ids))]
    return ({name: ray.data.from_pandas(frame) for name, frame in frames.items()},
            mcq.val_generate_items(tokenizer, generate, cfg.prompt))


def resolve_cache_dir(cfg: TrainConfig, output: Path) -> str:
    """model.cache_dir, by default OUTPUT/hf-cache: on the run's shared storage, so all
    workers and every restart reuse one download. The config keeps what the user wrote
    (a sweep's best.yaml must equal its trial's recorded config); the plan carries this."""
    return cfg.model.cache_dir or str((Path(output) / "hf-cache").resolve())


@contextmanager
def _sigint_handler_restored() -> Iterator[None]:
    """Ray Train's fit() installs a Ctrl-C handler that holds its controller actor's
    handle; left in place, the controller and the actors it owns outlive the run (~0.8 GiB
    that a demo's serving stages would otherwise share the machine with)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # fit() registers no handler off the main thread (e.g. inside Tune)
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _chat_template_decided(cfg: TrainConfig) -> TrainConfig:
    """`prompt.chat_template: auto` decided for the model's tokenizer (true or false)."""
    if cfg.prompt.chat_template != "auto":
        return cfg
    from medray.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    return cfg.model_copy(update={"prompt": cfg.prompt.with_chat_template_of(tokenizer)})


def run_training(cfg: TrainConfig, output: str | os.PathLike, *, log: Any = print,
                 callbacks: Sequence[Any] = (), display: Any = None, track: bool = True) -> dict:
    """`medray train`. `callbacks`: extra Ray Train callbacks on the TorchTrainer's RunConfig
    (a Tune sweep passes its TuneReportCallback here, medray.tune.trial). `display`: a
    medray.console.Display to draw the training progress bar on. `track`: log to the
    config's `tracking:` backends (a sweep's trials leave that to the sweep)."""
    from medray.train.tracked import finish_tracking, start_tracking

    output = Path(output)
    checked = preflight(cfg)
    cfg = _chat_template_decided(cfg)  # recorded in prompt.json and metrics.json as used
    # Opened before Ray work starts: a tracking server that cannot be reached fails here.
    tracker = start_tracking(cfg, output) if track else None
    if tracker is None:
        return _train(cfg, checked, output, log, callbacks, display, None)
    with tracker:  # ends the tracked run FAILED when training raises
        metrics = _train(cfg, checked, output, log, callbacks, display, tracker)
        finish_tracking(tracker, metrics, output, log)
    return metrics


def _train(cfg: TrainConfig, checked: Preflight, output: Path, log: Any,
           callbacks: Sequence[Any], display: Any, tracker: Any) -> dict:
    import ray

    from medray.cluster import check_shared_storage, require_connected
    from medray.io import claim_directory
    from medray.train.checkpoints import export_adapter, load_state
    from medray.train.data import tokenize_contexts
    from medray.train.progress import TrainingBoard

    require_connected("training")  # joined by the entry point, with scaling.local_cpus()
    # Workers on other nodes write checkpoints there and the driver exports from there.
    check_shared_storage(checkpoint_storage(cfg, output), "checkpoint storage")
    claim_directory(output, force=True, command="train")  # refusals: the CLI, before
    log(f"preflight ok: {checked.n_train} train / {checked.n_val} val examples, "
        f"LoRA targets {checked.lora_targets}")

    if checked.kind == "mcq":
        plan = schedule(cfg, checked, {})
        datasets, val_generate = _mcq_datasets(cfg, checked)
        log(f"assembled {checked.n_train} multiple-choice examples (the evaluation's prompt "
            f"per kind, key letters + EOS as target); ~{plan.total_steps} optimiser steps "
            "planned")
    else:
        contexts, how = tokenize_contexts(
            cfg.data.path, cfg.model.name_or_path, [cfg.data.train_split, cfg.data.val_split],
            concurrency=cfg.data.tokenize_actors,
            cluster_cpus=ray.cluster_resources().get("CPU", 0.0))
        plan = schedule(cfg, checked, contexts)
        log(f"tokenised {len(contexts)} epicrises ({cfg.data.train_split}, "
            f"{cfg.data.val_split}) once each {how}; ~{plan.total_steps} optimiser steps planned")
        contexts_ref = ray.put(contexts)
        datasets = _datasets(cfg, plan, contexts, contexts_ref)
        val_generate = _val_generate_items(cfg, checked.val_gen_ids, contexts)
    board = TrainingBoard() if display is not None or tracker is not None else None
    plan = replace(plan, cache_dir=resolve_cache_dir(cfg, output),
                   tensorboard_dir=str((output / "tensorboard").resolve()),
                   progress_board=board.name if board else None, val_generate=val_generate,
                   tracked=tracker is not None)
    trainer = build_trainer(cfg, output, plan, datasets, callbacks)
    try:
        with (board.shown(display) if board and display is not None else nullcontext(),
              board.relayed(tracker.log_metrics) if board and tracker else nullcontext(),
              _sigint_handler_restored()):
            result = trainer.fit()
    finally:
        if board:
            board.close()
    if result.error:
        raise result.error

    last = result.checkpoint
    if last is None:
        raise RuntimeError("training reported no checkpoint")
    best = last
    if cfg.checkpoint.export == "best" and result.best_checkpoints:
        key = cfg.checkpoint.metric
        scored = [(c, m) for c, m in result.best_checkpoints if key in m]
        if scored:
            pick = min if cfg.checkpoint.mode == "min" else max
            best = pick(scored, key=lambda cm: cm[1][key])[0]
    with last.as_directory() as d:
        state = load_state(d)
        if (Path(d) / "tensorboard").is_dir() and not (output / "tensorboard").exists():
            shutil.copytree(Path(d) / "tensorboard", output / "tensorboard")
    with best.as_directory() as d:
        export_adapter(d, output / "adapter", prompt=cfg.prompt)
        exported_record = load_state(d).get("checkpoint_record")
    metrics = {
        "model": cfg.model.name_or_path,
        "dataset": cfg.data.path,
        "adapter": str((output / "adapter").resolve()),
        "exported": {"which": cfg.checkpoint.export, "checkpoint": best.path,
                     "record": exported_record},  # the metrics it was saved with
        "initial": state.get("initial"),
        "epochs": state["history"],
        "resumed_from_step": state.get("resumed_from"),
        # Where each rank ran, per (re)start of the workers: node IP and Ray node id.
        "workers": state.get("workers", []),
        "evaluations": state.get("evaluations", []),  # optim.eval_every_steps
        "how": (MCQ_METRIC_NOTE if checked.kind == "mcq" else MEDQARO_METRIC_NOTE)
               + "; tokens_per_s: non-padding tokens of all workers / "
               "epoch wall time (forward+backward+step, excludes validation)",
        "plan": plan.summary(),
        "config": cfg.model_dump(mode="json"),
    }
    from medray.io import write_json_atomic

    write_json_atomic(output / "metrics.json", metrics)
    return metrics
