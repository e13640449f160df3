"""Search spaces: YAML parsing, checks against the training config, Tune/Optuna conversion.

No Ray cluster: these run in about a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.config import ConfigError
from medray.tune.plan import plan_sweep
from medray.tune.space import clean_value, load_space, parse_space

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "tune/spaces/medqaro_paper.yaml"
TINY = ROOT / "tune/spaces/tiny_cpu.yaml"
# configs/tiny-cpu.yaml leaves its paths to the command line (placeholders)
TINY_PATHS = ["model.name_or_path=runs/tiny-model", "data.path=runs/data"]


def _space(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(changes)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_paper_space_is_the_papers_grid():
    space = load_space(PAPER)
    grid = {k: p.grid_values() for k, p in space.params.items()}
    assert grid == {
        "optim.lr": [1e-6, 1e-5, 1e-4, 1e-3],
        "lora.dropout": [0.0, 0.05, 0.1, 0.15, 0.2],  # step 0.05, no float noise
        "lora.r": [4, 6, 8, 10],
        "lora.alpha": [8, 16, 32],
        "prompt.context_tokens": [1024, 2048, 3072, 4096],
    }
    assert space.grid_size() == 4 * 5 * 4 * 3 * 4
    assert space.params["optim.lr"].log_scale
    assert (space.search, space.metric, space.mode) == ("optuna", "val_f1", "max")


@pytest.mark.parametrize("config,space", [("phi-4-mini-3072.yaml", PAPER),
                                          ("tiny-cpu.yaml", TINY)])
def test_shipped_spaces_validate_against_their_configs(config, space, tmp_path):
    paths = TINY_PATHS if config == "tiny-cpu.yaml" else []
    plan = plan_sweep(ROOT / "configs" / config, space, tmp_path / "out", paths, search="grid")
    # the sweep metric also picks each trial's best checkpoint
    assert plan.base["checkpoint"]["metric"] == plan.metric
    assert Path(plan.base["data"]["path"]).is_absolute()  # trials run in another cwd


def test_tiny_space_fixed_values_and_cli_override_precedence(tmp_path):
    plan = plan_sweep(ROOT / "configs/tiny-cpu.yaml", TINY, tmp_path / "o",
                      [*TINY_PATHS, "data.max_train_examples=32", "optim.warmup_steps=1"])
    assert plan.base["scaling"]["num_workers"] == 1  # from the space's `fixed`
    assert plan.base["data"]["max_train_examples"] == 32  # command line beats `fixed`
    assert plan.base["optim"]["warmup_steps"] == 1
    assert plan.space.grid_size() == 4


def test_unknown_training_key_is_named(tmp_path):
    bad = _space(tmp_path, params={"lora.rank": [4, 8]})
    with pytest.raises(ConfigError) as exc:
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", bad, tmp_path / "o", TINY_PATHS)
    msg = str(exc.value)
    assert "lora.rank" in msg and "unknown key 'rank'" in msg and str(bad) in msg
    assert "alpha" in msg  # lists the keys that do exist
    bad = _space(tmp_path, fixed={"optim.learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="fixed: 'optim.learning_rate'"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", bad, tmp_path / "o", TINY_PATHS)


def test_unknown_space_key_and_bad_values_are_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'serach'"):
        parse_space({"serach": "grid", "params": {"lora.r": [4]}}, "s.yaml")
    with pytest.raises(ConfigError, match="loguniform needs low > 0"):
        parse_space({"params": {"optim.lr": {"type": "loguniform", "low": 0, "high": 1}}})
    bad = _space(tmp_path, params={"lora.r": [0, 4]})  # LoraConfig: r >= 1
    with pytest.raises(ConfigError, match=r"'lora.r' value 0 is rejected"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", bad, tmp_path / "o", TINY_PATHS)
    with pytest.raises(ConfigError, match="'lora' is a whole section"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", _space(tmp_path, params={"lora": [1]}),
                   tmp_path / "o", TINY_PATHS)


def test_grid_needs_discrete_values(tmp_path):
    space = _space(tmp_path, params={"optim.lr": {"type": "loguniform", "low": 1e-6,
                                                  "high": 1e-3}})
    with pytest.raises(ConfigError, match="grid search needs"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", space, tmp_path / "o", TINY_PATHS)
    plan = plan_sweep(ROOT / "configs/tiny-cpu.yaml", space, tmp_path / "o", TINY_PATHS,
                      search="random")
    assert plan.search == "random"


def test_metric_must_be_reported_and_overrides_must_not_clash(tmp_path):
    with pytest.raises(ConfigError, match="not reported by training"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", TINY, tmp_path / "o", TINY_PATHS,
                   metric="accuracy")
    with pytest.raises(ConfigError, match="also overridden"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", TINY, tmp_path / "o",
                   [*TINY_PATHS, "lora.r=16"])
    with pytest.raises(ConfigError, match="val_generate_examples > 0"):
        plan_sweep(ROOT / "configs/tiny-cpu.yaml", TINY, tmp_path / "o",
                   [*TINY_PATHS, "data.val_generate_examples=0"], metric="val_f1",
                   mode="max")


def test_random_and_optuna_sample_inside_the_space():
    from medray.tune.plan import SweepPlan
    from medray.tune.sweep import make_search_alg

    space = load_space(PAPER)
    plan = SweepPlan(output=Path("unused"), base={}, space=space, search="optuna",
                     num_samples=3, metric="val_f1", mode="max", max_concurrent_trials=1)
    searcher = make_search_alg(plan)
    assert type(searcher).__name__ == "OptunaSearch"
    assert searcher.set_search_properties("val_f1", "max", space.tune_param_space("optuna"))
    for i in range(3):
        cfg = searcher.suggest(f"t{i}")
        assert 1e-6 <= cfg["optim.lr"] <= 1e-3
        assert clean_value(cfg["lora.dropout"]) in (0.0, 0.05, 0.1, 0.15, 0.2)
        assert cfg["lora.r"] in (4, 6, 8, 10) and cfg["lora.alpha"] in (8, 16, 32)
        assert cfg["prompt.context_tokens"] in (1024, 2048, 3072, 4096)
    dom = space.tune_param_space("random")["optim.lr"]
    draws = dom.sample(size=200)
    assert min(draws) >= 1e-6 and max(draws) <= 1e-3
    assert sum(d < 1e-4 for d in draws) > 100  # log-uniform: most mass below the midpoint


def test_cli_bad_space_exits_2_without_output(tmp_path):
    from medray.cli import app

    bad = _space(tmp_path, params={"lora.rank": [4]})
    out = tmp_path / "sweep"
    res = CliRunner().invoke(app, ["tune", "--config", str(ROOT / "configs/tiny-cpu.yaml"),
                                   "--space", str(bad), "--output", str(out), *TINY_PATHS])
    assert res.exit_code == 2
    assert "lora.rank" in res.output
    assert not out.exists()
    res = CliRunner().invoke(app, ["tune", "--output", str(out), "--resume"])
    assert res.exit_code == 2 and "nothing to resume" in res.output


def test_grid_and_random_searchers_honour_max_concurrent_trials():
    # Tune ignores TuneConfig(max_concurrent_trials) for a BasicVariantGenerator instance
    from medray.tune.plan import SweepPlan
    from medray.tune.sweep import make_search_alg

    plan = SweepPlan(output=Path("unused"), base={}, space=load_space(TINY), search="grid",
                     num_samples=1, metric="val_loss", mode="min", max_concurrent_trials=1)
    assert make_search_alg(plan, 1).max_concurrent == 1
