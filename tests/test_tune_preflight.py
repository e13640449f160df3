"""`medray tune` checks what `medray train` checks before any trial starts (no Ray here),
and an all-failed sweep says why instead of plotting nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app
from medray.train.config import ConfigError
from medray.tune.outputs import PLOT, TRIALS_CSV, SweepFailed, root_cause, write_outputs
from medray.tune.plan import plan_sweep
from medray.tune.sweep import preflight_sweep

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/tiny-cpu.yaml"
SPACE = ROOT / "tune/spaces/tiny_cpu.yaml"


def test_missing_model_fails_the_sweep_cli_in_preflight(medqaro_prepared, tmp_path):
    out = tmp_path / "sweep"
    res = CliRunner().invoke(app, ["tune", "--config", str(CONFIG), "--space", str(SPACE),
                                   "--output", str(out), f"data.path={medqaro_prepared}",
                                   f"model.name_or_path={tmp_path / 'no-model'}"])
    assert res.exit_code == 2, res.output
    assert "sweep preflight (base config)" in res.output and "no-model" in res.output
    assert "Traceback" not in res.output
    assert not (out / "sweep").exists()  # Ray Tune never started


def test_missing_data_fails_in_preflight(tiny_model, tmp_path):
    plan = plan_sweep(CONFIG, SPACE, tmp_path / "o", [f"model.name_or_path={tiny_model}",
                                                      f"data.path={tmp_path / 'nodata'}"])
    with pytest.raises(ConfigError, match="not a prepared dataset"):
        preflight_sweep(plan, log=lambda *_: None)


def test_an_extreme_value_of_the_space_is_checked(tiny_model, medqaro_prepared, tmp_path):
    raw = yaml.safe_load(SPACE.read_text())
    raw["fixed"].pop("prompt.context_tokens", None)
    raw["params"]["prompt.context_tokens"] = [512, 24]  # 24 tokens cannot hold a prompt
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(raw))
    base = [f"model.name_or_path={tiny_model}", f"data.path={medqaro_prepared}"]
    plan = plan_sweep(CONFIG, space, tmp_path / "o", base, search="grid")
    with pytest.raises(ConfigError, match=r"prompt\.context_tokens=24"):
        preflight_sweep(plan, log=lambda *_: None)
    ok = plan_sweep(CONFIG, SPACE, tmp_path / "o2", base)
    logs: list[str] = []
    preflight_sweep(ok, log=logs.append)
    assert logs and logs[-1].startswith("preflight ok")


class _Wrapped(Exception):
    def __init__(self, msg: str, cause: BaseException) -> None:
        super().__init__(msg)
        self.cause = cause


def test_root_cause_unwraps_tune_and_train_errors():
    inner = FileNotFoundError("model runs/tiny-model not found")
    try:
        try:
            raise inner
        except FileNotFoundError as e:
            raise RuntimeError("worker group failed") from e
    except RuntimeError as mid:
        outer = _Wrapped("HTTPError 404 wrapped by Tune\ntrace", mid)
    assert root_cause(outer) == "FileNotFoundError: model runs/tiny-model not found"


def test_all_failed_sweep_raises_with_the_first_cause_and_draws_no_plot(tmp_path):
    from test_tune_outputs import _trial  # the suite's stand-in Tune results

    plan = plan_sweep(CONFIG, SPACE, tmp_path / "out", ["model.name_or_path=m", "data.path=d"])
    root = plan.experiment_dir
    results = [_trial(root, f"a_0000{i}", 1e-3, 4, [], [], False,
                      _Wrapped("wrapped", ValueError(f"data split 'val' missing ({i})")))
               for i in range(2)]
    with pytest.raises(SweepFailed, match=r"all 2 trials failed.*a_00000: ValueError: data "
                                          r"split 'val' missing \(0\)"):
        write_outputs(plan, results, log=lambda *_: None)
    assert (plan.output / TRIALS_CSV).is_file() and not (plan.output / PLOT).exists()
    assert "ValueError: data split" in (plan.output / TRIALS_CSV).read_text()
