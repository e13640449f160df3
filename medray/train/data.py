"""The Ray Data side of training: each epicrisis tokenised once (in the driver or by an
actor pool), then examples assembled from token ids (medray.prompts.tokens) and streamed
to the Train workers."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from medray.prompts.spec import TRAIN_STRATEGIES, PromptSpec
from medray.prompts.tokens import build_training_examples, encode_context


class ContextTokenizer:
    """Ray Data actor: tokenise a batch of epicrises (each epicrisis exactly once)."""

    def __init__(self, tokenizer_path: str) -> None:
        from medray.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path)

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pandas as pd

        ids = [np.asarray(encode_context(self.tokenizer, t), dtype=np.int32) for t in batch["text"]]
        return pd.DataFrame({"context_id": batch["context_id"], "context_ids": ids})


class ExampleAssembler:
    """Ray Data actor: assemble examples from the shared table of tokenised epicrises."""

    def __init__(self, tokenizer_path: str, contexts: Any, spec: PromptSpec) -> None:
        import ray

        from medray.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path)
        # An ObjectRef to {context_id: int32 array}: fetched once per actor, zero-copy.
        self.contexts = ray.get(contexts) if isinstance(contexts, ray.ObjectRef) else contexts
        self.spec = spec

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pandas as pd

        rows: dict[str, list] = {"id": [], "input_ids": [], "labels": [], "n_tokens": []}
        for ex_id, q, a, cid in zip(batch["id"], batch["question"], batch["answer"],
                                    batch["context_id"], strict=True):
            for ex in build_training_examples(self.tokenizer, q, a, self.contexts[cid],
                                              self.spec):
                rows["id"].append(ex_id)
                rows["input_ids"].append(np.asarray(ex["input_ids"], dtype=np.int32))
                rows["labels"].append(np.asarray(ex["labels"], dtype=np.int32))
                rows["n_tokens"].append(len(ex["input_ids"]))
        return pd.DataFrame(rows)


# Below this many characters of epicrisis text the driver tokenises in-process: a Ray Data
# actor pool first pays ~10 s to start its actors (process, imports, tokenizer load; measured
# on 2 cores), and a fast tokenizer does ~1.4 M characters/s on one core (the tiny BPE,
# measured), so a pool of two only wins past ~20 s of work.
IN_PROCESS_MAX_CHARS = 30_000_000
POOL_MIN_CPUS = 4  # with fewer, the actors share the cores the driver's loop would use


def tokenise_in_process(chars: int, cluster_cpus: float,
                        max_chars: int = IN_PROCESS_MAX_CHARS) -> bool:
    """Whether the driver's own loop is the faster place for `chars` of epicrisis text."""
    return chars <= max_chars or cluster_cpus < POOL_MIN_CPUS


def split_contexts(data_dir: str | os.PathLike, splits: Sequence[str]) -> Any:
    """The epicrises (context_id, text) that the examples of `splits` read, once each."""
    import pandas as pd

    from medray.data.prepared import CONTEXTS, EXAMPLES

    root = Path(data_dir)
    wanted = pd.read_parquet(root / EXAMPLES, columns=["context_id"],
                             filters=[("split", "in", list(splits))])["context_id"].unique()
    return pd.read_parquet(root / CONTEXTS, columns=["context_id", "text"],
                           filters=[("context_id", "in", wanted.tolist())])


def tokenize_contexts(data_dir: str | os.PathLike, tokenizer_path: str,
                      splits: Sequence[str], *, concurrency: int = 2, batch_size: int = 8,
                      cluster_cpus: float = 0.0,
                      in_process_max_chars: int = IN_PROCESS_MAX_CHARS) -> tuple[dict, str]:
    """({context_id: int32 token ids}, how): each epicrisis the `splits` read tokenised
    exactly once, in this process when that is faster (little text, or a cluster too small
    for a pool to pay), else by a Ray Data actor pool of up to `concurrency` actors."""
    import numpy as np

    texts = split_contexts(data_dir, splits)
    chars = int(texts["text"].str.len().sum())
    if tokenise_in_process(chars, cluster_cpus, in_process_max_chars):
        from medray.models import load_tokenizer

        tok = load_tokenizer(tokenizer_path)
        table = {cid: np.asarray(encode_context(tok, text), dtype=np.int32)
                 for cid, text in zip(texts["context_id"], texts["text"], strict=True)}
        return table, "in-process"
    import ray

    blocks = max(1, min(len(texts), 4 * concurrency))  # one block would keep one actor busy
    ds = ray.data.from_pandas([texts.iloc[i::blocks] for i in range(blocks)]).map_batches(
        ContextTokenizer,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(concurrency, 1)),
        num_cpus=0.5,
    )
    return context_table(ds), f"by a Ray Data actor pool (up to {concurrency} actors)"


def context_table(contexts_ds: Any) -> dict[str, Any]:
    """Gather the tokenised epicrises (small: ~4 bytes per token) into one shared table."""
    table: dict[str, Any] = {}
    for batch in contexts_ds.iter_batches(batch_format="pandas", batch_size=256):
        table.update(zip(batch["context_id"], batch["context_ids"], strict=True))
    return table


def examples_dataset(data_dir: str | os.PathLike, split: str, tokenizer_path: str,
                     contexts_ref: Any, spec: PromptSpec, *, ids: list[str] | None = None,
                     num_cpus: float = 0.5) -> Any:
    """Lazy Ray Dataset of assembled examples for one split (streamed to Train workers)."""
    import ray

    if spec.strategy not in TRAIN_STRATEGIES:
        raise ValueError(f"prompt.strategy {spec.strategy!r} cannot be trained; expected "
                         f"one of {TRAIN_STRATEGIES}")
    from medray.data.prepared import read_table

    ds = read_table(data_dir, "examples", ["id", "split", "question", "answer", "context_id"]
                    ).filter(expr=f"split == '{split}'")
    if ids is not None:  # a fixed subset (max_*_examples), chosen by the driver
        wanted = set(ids)
        ds = ds.filter(lambda r: r["id"] in wanted)
    return ds.map_batches(
        ExampleAssembler,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path, "contexts": contexts_ref,
                               "spec": spec},
        batch_size=32,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=num_cpus,
    )


def iter_rows_from_batches(batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Rows (dicts of lists) out of Ray Data numpy batches."""
    for batch in batches:
        for i in range(len(batch["input_ids"])):
            yield {"input_ids": batch["input_ids"][i].tolist(),
                   "labels": batch["labels"][i].tolist()}
