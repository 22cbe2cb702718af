"""The quantize table (TPU-MLIR's `--quantize_table`): per op, the mode it must run in,
overriding the model's mode. One `op_name MODE` per line; `#` starts a comment.

    # keep the detector's head in F16
    conv_head F16
    concat_out F32

>>> parse_qtable("a F16\\n# note\\nb  INT8\\n")
{'a': 'F16', 'b': 'INT8'}
"""

from __future__ import annotations

from pathlib import Path

from tftpu.errors import ModelFileError
from tftpu.utils.files import write_text

__all__ = ["read_qtable", "parse_qtable", "qtable_text", "QTABLE_MODES"]

QTABLE_MODES = ("F32", "BF16", "F16", "INT8")


def parse_qtable(text: str, source: str = "<qtable>") -> dict[str, str]:
    """Op name -> mode; ModelFileError naming the line for anything else."""
    table: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        parts = body.split()
        if len(parts) != 2:
            raise ModelFileError(f"{source}:{no}", f"expected 'op_name MODE', got {body[:80]!r}")
        name, mode = parts[0], parts[1].upper()
        if mode not in QTABLE_MODES:
            raise ModelFileError(f"{source}:{no}", f"mode {parts[1]!r} is not one of {', '.join(QTABLE_MODES)}")
        if name in table:
            raise ModelFileError(f"{source}:{no}", f"op {name!r} listed twice")
        table[name] = mode
    return table


def read_qtable(path) -> dict[str, str]:
    """Read a quantize table file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelFileError(path, "no such quantize table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not a readable quantize table ({exc})") from None
    return parse_qtable(text, str(path))


def qtable_text(table: dict[str, str], note: str = "") -> str:
    """The file form of a quantize table (what `read_qtable` reads back)."""
    head = ["# tftpu quantize table: op_name mode"] + [f"# {line}" for line in note.splitlines()]
    return "\n".join(head + [f"{name} {mode}" for name, mode in table.items()]) + "\n"


def save_qtable(path, table: dict[str, str], note: str = "") -> None:
    write_text(path, qtable_text(table, note))
