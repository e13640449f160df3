"""One config loader: every YAML config fails the same way, with a ConfigError that names
the file and the dotted key (no Ray, no model: pure parsing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from medray.config import ConfigError, Strict, apply_overrides, load_yaml, read_yaml

ROOT = Path(__file__).resolve().parents[1]


class Inner(Strict):
    size: int = 1


class Outer(Strict):
    name: str
    inner: Inner = Inner()


def _write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_nested_key_names_file_and_dotted_key(tmp_path):
    path = _write(tmp_path / "c.yaml", {"name": "x", "inner": {"sise": 2}})
    with pytest.raises(ConfigError) as err:
        load_yaml(Outer, path)
    assert str(err.value) == f"{path}: unknown key 'inner.sise'"


def test_bad_value_and_missing_key_are_named(tmp_path):
    path = _write(tmp_path / "c.yaml", {"inner": {"size": "big"}})
    with pytest.raises(ConfigError) as err:
        load_yaml(Outer, path)
    msg = str(err.value)
    assert f"{path}: missing key 'name'" in msg and f"{path}: 'inner.size':" in msg


def test_overrides_apply_and_bad_overrides_are_config_errors(tmp_path):
    path = _write(tmp_path / "c.yaml", {"name": "x"})
    assert load_yaml(Outer, path, ["inner.size=7"]).inner.size == 7
    with pytest.raises(ConfigError, match="not key=value"):
        load_yaml(Outer, path, ["inner.size"])
    with pytest.raises(ConfigError, match="'name' is not a section"):
        apply_overrides({"name": "x"}, ["name.deeper=1"])
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'inner.colour'"):
        load_yaml(Outer, path, ["inner.colour=red"])


@pytest.mark.parametrize("text, why", [("a: [1, 2", "not valid YAML"),
                                       ("- 1\n- 2\n", "top level must be a mapping")])
def test_unreadable_yaml_names_the_file(tmp_path, text, why):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=why) as err:
        read_yaml(path)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match=f"config file {tmp_path / 'none.yaml'} not found"):
        read_yaml(tmp_path / "none.yaml")


def test_train_config_errors(tmp_path):
    from medray.train.config import load_config

    path = _write(tmp_path / "t.yaml", {"model": {"name_or_path": "m"},
                                        "data": {"path": "d", "contex_tokens": 10}})
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'data.contex_tokens'"):
        load_config(path)


def test_eval_config_errors(tmp_path):
    from medray.eval.config import load_eval_config

    path = _write(tmp_path / "e.yaml", {"data": "d", "engine": {"kind": "vllm", "model": "m",
                                                               "devise": "gpu"}})
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'engine.devise'"):
        load_eval_config(path)
    with pytest.raises(ConfigError, match=f"eval config {tmp_path / 'no.yaml'} not found"):
        load_eval_config(tmp_path / "no.yaml")


def test_serve_config_errors_name_the_key_inside_the_serve_file(tmp_path):
    from medray.serve.config import load_serve_file

    raw = yaml.safe_load((ROOT / "serve" / "medqaro-cpu.yaml").read_text())
    raw["applications"][0]["args"]["max_model_lenght"] = 512
    path = _write(tmp_path / "s.yaml", raw)
    with pytest.raises(ConfigError) as err:
        load_serve_file(path)
    assert f"{path}: unknown key 'applications.0.args.max_model_lenght'" in str(err.value)
    with pytest.raises(ConfigError, match="no `applications` entry"):
        load_serve_file(_write(tmp_path / "empty.yaml", {"http_options": {}}))


def test_search_space_errors(tmp_path):
    from medray.tune.space import load_space

    path = _write(tmp_path / "s.yaml", {"params": {"lora.r": {"type": "int", "lo": 1}}})
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'params.lora.r.lo'"):
        load_space(path)
    with pytest.raises(ConfigError, match=f"search space {tmp_path / 'x.yaml'} not found"):
        load_space(tmp_path / "x.yaml")
