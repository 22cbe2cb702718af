"""YAML configuration files under `configs/<kind>/` (chips, hardware), found by name or path.

The bundled configs ship inside the package (`tftpu/configs/`, read through importlib.resources),
so an installed wheel finds them as a source checkout does.

One place resolves "name or path", reads the YAML safely and turns every failure into a
one-line `ConfigError` naming the file; callers check their own fields.

>>> data = load_yaml(resolve("chips", "tpu"), "chip config")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from tftpu.errors import ConfigError

#: The bundled `configs/` folder, part of the installed package.
DEFAULT_ROOT = Path(os.fspath(resources.files("tftpu") / "configs"))


def config_dir(kind: str) -> Path:
    """Folder of `kind` configs: `$TFTPU_<KIND>_CONFIGS`, else `$TFTPU_CONFIGS/<kind>`, else bundled."""
    env = os.environ.get(f"TFTPU_{kind.upper()}_CONFIGS")
    if env:
        return Path(env)
    root = os.environ.get("TFTPU_CONFIGS")
    return (Path(root) if root else DEFAULT_ROOT) / kind


def known(kind: str) -> list[str]:
    """Names (file stems) of the `kind` configs available, sorted."""
    return sorted(p.stem for p in config_dir(kind).glob("*.yaml"))


def find(kind: str, name: str) -> Path | None:
    """`<config_dir(kind)>/<name>.yaml` if that file exists, else None."""
    path = config_dir(kind) / f"{name}.yaml"
    return path if path.is_file() else None


def resolve(kind: str, name_or_path, what: str = "config") -> Path:
    """A config file given as a name (`tpu`) or a path (ending .yaml/.yml or holding a path
    separator; str or PathLike); ConfigError listing the known names if it does not exist."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not os.fspath(name_or_path):
        raise ConfigError(f"{what} {name_or_path!r}: expected a name ({', '.join(known(kind)) or 'none known'}) "
                          "or a .yaml path")
    text = os.fspath(name_or_path)
    is_path = text.endswith((".yaml", ".yml")) or os.sep in text or (os.altsep or os.sep) in text
    path = Path(text) if is_path else config_dir(kind) / f"{text}.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what} (known {kind}: {', '.join(known(kind)) or 'none'})")
    return path


def load_yaml(path, what: str = "config") -> dict:
    """The top-level mapping of YAML file `path`; ConfigError naming the file if missing or bad."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(f"{path}: no such {what}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data
