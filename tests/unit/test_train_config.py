"""The training config: YAML keys, overrides, precedence of the compression flag, clear errors."""
import pytest

from hvdsketch import spec
from hvdsketch.spec import SpecError
from hvdsketch.lab.config import TrainConfig


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    path = write(tmp_path, "workload: lstm\ncompression: fp16\nepochs: 3\n")
    assert TrainConfig.load(path) == TrainConfig(workload="lstm", compression="fp16", epochs=3)
    assert TrainConfig.load(path, epochs=1, compression="sketch").compression == "sketch"
    monkeypatch.setenv(spec.ENV_VAR, "sketch:rows=3")
    assert TrainConfig.load(path).compression == "sketch:rows=3"  # environment beats the config
    assert TrainConfig.load(path, compression="none").compression == "none"  # --compression beats both


@pytest.mark.parametrize("text, message", [
    ("workload: lstm\nepoch: 3\n", r"unknown key\(s\) epoch; valid: .*epochs"),
    ("compression: sketch\n", "needs a workload"),
    ("- just a list\n", "must be a mapping"),
])
def test_bad_configs_raise_clear_errors(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        TrainConfig.load(write(tmp_path, text))
