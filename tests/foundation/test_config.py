"""tftpu.utils.config: one name-or-path resolution and YAML loading for chips and hardware."""

import pytest

from tftpu.errors import ConfigError
from tftpu.ir.layout import load_chip
from tftpu.passes.cost import Target
from tftpu.tac.hardware import config as hw_config
from tftpu.utils import config

KINDS = ("chips", "hardware")


@pytest.mark.parametrize("kind", KINDS)
def test_bundled_names_resolve_and_load(kind):
    names = config.known(kind)
    assert names, kind
    for name in names:
        path = config.resolve(kind, name)
        assert path == config.DEFAULT_ROOT / kind / f"{name}.yaml"
        assert isinstance(config.load_yaml(path), dict)
        assert config.resolve(kind, str(path)) == path and config.resolve(kind, path) == path


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_name_lists_known(kind):
    with pytest.raises(ConfigError, match=f"no such thing \\(known {kind}: .*{config.known(kind)[0]}"):
        config.resolve(kind, "no_such_name", "thing")
    assert config.find(kind, "no_such_name") is None


@pytest.mark.parametrize("text,msg", [("a: [1\n", "not valid YAML"), ("- 1\n", "expected a mapping"),
                                      ("", "expected a mapping"), ("just text\n", "expected a mapping")])
def test_bad_yaml_names_file(tmp_path, text, msg):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg) as e:
        config.load_yaml(p)
    assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="no such widget"):
        config.load_yaml(tmp_path / "missing.yaml", "widget")


def test_configs_root_env_and_kind_env(tmp_path, monkeypatch):
    for kind in KINDS:
        (tmp_path / kind).mkdir()
        for name in config.known(kind):
            (tmp_path / kind / f"{name}.yaml").write_text((config.DEFAULT_ROOT / kind / f"{name}.yaml").read_text())
    src = (config.DEFAULT_ROOT / "chips" / "tpu.yaml").read_text()
    (tmp_path / "chips" / "mine.yaml").write_text(src.replace("name: tpu", "name: mine"))
    monkeypatch.setenv("TFTPU_CONFIGS", str(tmp_path))
    assert config.config_dir("chips") == tmp_path / "chips"
    assert Target.load("mine").name == "mine"
    assert load_chip(config.known("chips")[0]).name
    assert hw_config.config_dir() == tmp_path / "hardware"
    # the TAC-specific variable still wins for hardware
    monkeypatch.setenv("TFTPU_HARDWARE_CONFIGS", str(config.DEFAULT_ROOT / "hardware"))
    assert hw_config.config_dir() == config.DEFAULT_ROOT / "hardware"
    monkeypatch.delenv("TFTPU_CONFIGS")
    with pytest.raises(ConfigError, match="known chips"):
        Target.load("mine")
