"""The streaming MedQARo reader gives what the pandas reader (`pd.read_csv(index_col=0)`,
the reference's way to read the release) gave, on the synthetic release whose epicrises
span several lines inside quoted fields."""

from __future__ import annotations

import pandas as pd

from medray.data.medqaro import SPLIT_FILES
from medray.data.prepared import load_prepared
from medray.text import normalize


def test_streaming_equals_the_pandas_semantics(synthetic_medqaro_raw, medqaro_prepared):
    data = load_prepared(medqaro_prepared)
    examples = data.examples.set_index("id")
    contexts = dict(zip(data.contexts["context_id"], data.contexts["text"], strict=True))
    seen = 0
    for split, names in SPLIT_FILES.items():
        path = synthetic_medqaro_raw / names[0]
        if not path.is_file():
            continue
        frame = pd.read_csv(path, index_col=0, dtype=str, keep_default_na=False)
        assert any("\n" in e for e in frame["Epicriza"])  # multi-line records are exercised
        for index, record in frame.iterrows():
            row = examples.loc[f"{split}:{index}"]
            assert row["question"] == normalize(record["Intrebare"])
            assert row["answer"] == normalize(record["Raspuns"])
            assert contexts[row["context_id"]] == normalize(record["Epicriza"])
            assert row["question_type"] == record["question_type"]
            seen += 1
    assert seen == len(examples)
