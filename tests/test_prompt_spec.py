"""The prompt contract (medray.prompts.PromptSpec): validation, the one context-room
arithmetic, prompt.json round trips, resolution with overrides (and their warning), and
the old flat keys failing with the new key's name."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from medray.prompts.spec import (
    PROMPT_FILE,
    PromptSpec,
    load_prompt_spec,
    resolve_prompt,
    write_prompt_spec,
)

Q = "Are pacienta metastaze osoase?"


@pytest.fixture(scope="module")
def tok(tiny_model):
    from medray.models import load_tokenizer

    return load_tokenizer(str(tiny_model))


def test_defaults_are_the_reference_and_validation_is_strict():
    spec = PromptSpec()
    assert (spec.format, spec.context_tokens, spec.max_new_tokens, spec.strategy,
            spec.chat_template, spec.shots) == ("qea", 2048, 10, "trim", "auto", 0)
    assert spec.reserve is None and spec.answer_reserve == 10  # reserve = max_new_tokens
    assert PromptSpec(max_new_tokens=24).answer_reserve == 24
    assert PromptSpec(max_new_tokens=24, reserve=3).answer_reserve == 3
    for bad in ({"prompt_format": "qea"}, {"format": "aqe"}, {"shots": 2},
                {"context_tokens": 4}, {"strategy": "bm25"}, {"max_new_tokens": 0},
                {"reserve": -1}, {"chunk_tokens": 0}):
        with pytest.raises(ValidationError):
            PromptSpec(**bad)
    with pytest.raises(ValidationError):  # frozen: a spec is a value
        spec.context_tokens = 5  # type: ignore[misc]


def test_context_room_arithmetic():
    spec = PromptSpec(context_tokens=100)  # reserve 10
    assert spec.context_room(30) == 60
    assert spec.context_room(30, answer_tokens=4) == 60  # a short answer fits the reserve
    assert spec.context_room(30, answer_tokens=25) == 45  # a long one takes more room
    assert PromptSpec(context_tokens=100, reserve=0).context_room(30, 4) == 66
    assert spec.context_room(95) == -5  # does not fit: callers raise BudgetError

    class Pieces:
        fixed = 30

    assert spec.context_room(Pieces()) == 60


def test_room_is_what_the_token_assembly_keeps(tok):
    from medray.prompts.tokens import (
        build_example,
        build_prompt_ids,
        encode_context,
        prompt_pieces,
        question_room,
    )

    context = encode_context(tok, "Pacienta de 54 ani, carcinom mamar invaziv. " * 40)
    for spec in (PromptSpec(context_tokens=120), PromptSpec(format="eqa", context_tokens=90,
                                                            max_new_tokens=4)):
        room = question_room(tok, Q, spec)
        pieces = prompt_pieces(tok, Q, spec)
        assert room == spec.context_tokens - spec.answer_reserve - pieces.fixed
        ids = build_prompt_ids(tok, Q, context, spec)
        assert len(ids) == pieces.fixed + room == spec.context_tokens - spec.answer_reserve
        ex = build_example(tok, Q, "Nu", context, spec)  # training: the same prompt
        assert ex["input_ids"][:len(ids)] == ids


def test_chat_template_is_applied_in_one_place(tok):
    import copy

    from medray.prompts.text import ChatPrompt, prompt_text
    from medray.prompts.tokens import build_prompt_ids, encode_context

    chat = ChatPrompt(system="S", user="U")
    assert prompt_text(chat, tok, PromptSpec(chat_template=False)) == chat.text  # the papers
    templated = prompt_text(chat, tok, PromptSpec(chat_template=True))
    # The template's BOS is left to the tokenizer, which adds it on encoding: one BOS.
    full = tok.apply_chat_template(chat.messages(), tokenize=False, add_generation_prompt=True)
    assert full.startswith(tok.bos_token) and templated == full[len(tok.bos_token):]
    assert tok.encode(templated).count(tok.bos_token_id) == 1
    # The tiny model's template renders the bare prompt: "auto" (the default) reads the same.
    assert prompt_text(chat, tok, PromptSpec()) == templated == chat.text
    # MedQARo prompts too: the template wraps question + epicrisis, trimmed as usual. The
    # tiny model's template renders the bare prompt (BOS + text): the same ids, one BOS.
    context = encode_context(tok, "epicriza " * 100)
    plain = build_prompt_ids(tok, Q, context, PromptSpec(context_tokens=80))
    assert build_prompt_ids(tok, Q, context, PromptSpec(context_tokens=80,
                                                        chat_template=True)) == plain
    marked = copy.deepcopy(tok)
    marked.chat_template = ("{{ bos_token }}[U] {% for m in messages %}{{ m['content'] }}"
                            "{% endfor %} [A]")
    ids = build_prompt_ids(marked, Q, context, PromptSpec(context_tokens=80, chat_template=True))
    assert len(ids) == 70 and ids.count(tok.bos_token_id) == 1
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.startswith("[U] Intrebare:") and text.endswith("Raspuns: [A]")
    assert build_prompt_ids(marked, Q, context, PromptSpec(context_tokens=80)) == ids  # auto
    assert build_prompt_ids(marked, Q, context, PromptSpec(context_tokens=80,
                                                           chat_template=False)) == plain


def test_chat_template_auto_follows_the_tokenizer_and_true_requires_one(tok):
    import copy

    from medray.prompts.text import ChatPrompt, prompt_text

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    chat = ChatPrompt(system="S", user="U")
    assert PromptSpec().uses_chat_template(tok) and not PromptSpec().uses_chat_template(bare)
    assert not PromptSpec().uses_chat_template(None)
    assert prompt_text(chat, bare, PromptSpec()) == chat.text
    with pytest.raises(ValueError, match="chat_template is true but the tokenizer has none"):
        prompt_text(chat, bare, PromptSpec(chat_template=True))
    # What a run records: auto decided for its tokenizer; a forced value stays as set.
    assert PromptSpec().with_chat_template_of(tok).chat_template is True
    assert PromptSpec().with_chat_template_of(bare).chat_template is False
    assert PromptSpec(chat_template=False).with_chat_template_of(tok).chat_template is False
    assert PromptSpec.model_validate({"chat_template": "auto"}).chat_template == "auto"
    with pytest.raises(ValidationError):
        PromptSpec.model_validate({"chat_template": "sometimes"})


def test_prompt_json_round_trip_and_damage(tmp_path):
    assert load_prompt_spec(tmp_path) is None  # not a model medray trained
    spec = PromptSpec(format="eqa", context_tokens=512, strategy="chunks")
    write_prompt_spec(tmp_path, spec)
    assert load_prompt_spec(tmp_path) == spec
    (tmp_path / PROMPT_FILE).write_text(json.dumps({"format": "qea", "surprise": 1}))
    with pytest.raises(ValueError, match=f"{PROMPT_FILE}.*not a valid prompt spec"):
        load_prompt_spec(tmp_path)


def test_resolution_keeps_training_and_warns_on_a_differing_override():
    trained = PromptSpec(format="eqa", context_tokens=288, max_new_tokens=10)
    seen: list[str] = []
    assert resolve_prompt(trained, None, source="ft", warn=seen.append) == trained
    assert resolve_prompt(None, None, source="base", warn=seen.append) == PromptSpec()
    # Only the fields the override sets replace training's; equal values are no warning.
    same = resolve_prompt(trained, PromptSpec(context_tokens=288), source="ft", warn=seen.append)
    assert same == trained and seen == []
    got = resolve_prompt(trained, PromptSpec(max_new_tokens=20), source="adapter ft",
                         warn=seen.append)
    assert got == trained.model_copy(update={"max_new_tokens": 20})
    assert got.format == "eqa" and got.context_tokens == 288
    (message,) = seen
    assert "adapter ft" in message and "max_new_tokens: trained with 10, configured 20" in message
    # No recorded spec: the override over the defaults, nothing to warn about.
    assert resolve_prompt(None, PromptSpec(max_new_tokens=20), source="base",
                          warn=seen.append).context_tokens == 2048 and len(seen) == 1


def test_default_warning_goes_to_stderr(capsys):
    resolve_prompt(PromptSpec(), PromptSpec(format="eqa"), source="m")
    err = capsys.readouterr().err
    assert "warning:" in err and "format: trained with 'qea', configured 'eqa'" in err


def test_serve_config_reads_the_model_folder_and_warns_on_override(tmp_path):
    from medray.serve.config import AppConfig

    model, adapter = tmp_path / "merged", tmp_path / "adapter"
    model.mkdir()
    adapter.mkdir()
    trained = PromptSpec(context_tokens=300, strategy="chunks")
    write_prompt_spec(model, trained)
    write_prompt_spec(adapter, trained.model_copy(update={"format": "eqa"}))
    cfg = AppConfig(model=str(model), adapters={"ft": str(adapter)}, device="cpu")
    assert cfg.prompt_for("medray") == trained
    assert cfg.prompt_for("medray:ft").format == "eqa"
    seen: list[str] = []
    over = AppConfig(model=str(model), device="cpu", prompt={"context_tokens": 256})
    assert over.prompt_for("medray", warn=seen.append) == trained.model_copy(
        update={"context_tokens": 256})
    assert len(seen) == 1 and "context_tokens: trained with 300, configured 256" in seen[0]


def test_eval_prompt_comes_from_the_evaluated_model(tmp_path):
    from medray.eval.config import EvalConfig
    from medray.eval.prompting import resolve_eval_prompt

    model, adapter = tmp_path / "base", tmp_path / "adapter"
    model.mkdir()
    adapter.mkdir()
    write_prompt_spec(adapter, PromptSpec(context_tokens=300, max_new_tokens=12))
    engine = {"kind": "vllm", "model": str(model), "adapter": str(adapter)}
    cfg = EvalConfig(data=tmp_path, engine=engine)
    assert resolve_eval_prompt(cfg) == PromptSpec(context_tokens=300, max_new_tokens=12)
    seen: list[str] = []
    cfg = EvalConfig(data=tmp_path, engine=engine, prompt={"max_new_tokens": 10})
    assert resolve_eval_prompt(cfg, warn=seen.append).max_new_tokens == 10
    assert "max_new_tokens: trained with 12, configured 10" in seen[0]


def test_old_flat_keys_name_the_new_ones(tmp_path):
    import yaml

    from medray.eval.config import load_eval_config
    from medray.serve.config import AppConfig
    from medray.train.config import ConfigError, load_config

    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"model": {"name_or_path": "m"},
                                     "data": {"path": "d", "context_tokens": 512,
                                              "mode": "chunks"}}))
    with pytest.raises(ConfigError) as err:
        load_config(train)
    assert "'data.context_tokens' moved to 'prompt.context_tokens'" in str(err.value)
    assert "'data.mode' moved to 'prompt.strategy'" in str(err.value)
    assert str(train) in str(err.value)
    ok = load_config(_write(tmp_path, {"model": {"name_or_path": "m"}, "data": {"path": "d"},
                                       "prompt": {"context_tokens": 512}}))
    assert ok.prompt.context_tokens == 512 and ok.prompt.max_new_tokens == 10
    with pytest.raises(ConfigError, match="prompt.strategy 'retrieve' cannot be trained"):
        load_config(_write(tmp_path, {"model": {"name_or_path": "m"}, "data": {"path": "d"},
                                      "prompt": {"strategy": "retrieve"}}))
    ev = _write(tmp_path, {"data": str(tmp_path), "engine": {"kind": "baseline",
                                                             "baseline": "majority"},
                           "max_new_tokens": 12})
    with pytest.raises(ValueError, match="'max_new_tokens' moved to 'prompt.max_new_tokens'"):
        load_eval_config(ev)
    with pytest.raises(ValueError, match="'context_tokens' moved to 'prompt.context_tokens'"):
        AppConfig(model="m", device="cpu", context_tokens=256)


def _write(tmp_path, raw: dict):
    import yaml

    path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_serving_builds_the_training_prompt_token_for_token(tok, tiny_model, medqaro_prepared):
    """The pieces Serve's /v1/qa and the eval actors use (plan_strategy) give the prompt
    training's example assembler builds, for real prepared examples and a trimmed budget."""
    import pandas as pd

    from medray.data.prepared import load_prepared
    from medray.prompts.strategies import plan_strategy
    from medray.prompts.tokens import IGNORE_INDEX
    from medray.train.data import ContextTokenizer, ExampleAssembler

    data = load_prepared(medqaro_prepared)
    examples = data.split("test").head(6)
    contexts_df = ContextTokenizer(str(tiny_model))(data.contexts[["context_id", "text"]])
    contexts = dict(zip(contexts_df["context_id"], contexts_df["context_ids"], strict=True))
    for spec in (PromptSpec(context_tokens=128), PromptSpec(format="eqa", context_tokens=200,
                                                            max_new_tokens=6)):
        built = ExampleAssembler(str(tiny_model), contexts, spec)(
            pd.DataFrame(examples[["id", "question", "answer", "context_id"]]))
        for row, ids, labels in zip(examples.itertuples(index=False), built["input_ids"],
                                    built["labels"], strict=True):
            prompt = ids[:int((labels == IGNORE_INDEX).sum())].tolist()
            (served,) = plan_strategy(tok, row.question, data.context(row.context_id),
                                      spec).prompts
            assert served == prompt
            assert len(prompt) == spec.context_tokens - spec.answer_reserve  # trimmed
