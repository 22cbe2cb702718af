"""The calibration table: per tensor, the INT8 threshold and the observed min and max.

Text in TPU-MLIR's layout (`# op_name threshold min max`, one tensor per line, in the model's
order), so its tables and ours read the same. No timestamp: the same calibration writes the
same bytes.

>>> table = CalibrationTable({"conv1": (4.3, -4.178, 4.493)}, method="kl", samples=20)
>>> print(table.text().splitlines()[-1])
conv1 4.3 -4.178 4.493
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from tftpu.errors import ModelFileError
from tftpu.utils.files import write_text

__all__ = ["CalibrationTable", "read_table"]


def _num(v: float) -> str:
    return f"{float(v):.9g}"


@dataclasses.dataclass
class CalibrationTable:
    """`entries`: tensor name -> (threshold, min, max), in model order."""

    entries: dict[str, tuple[float, float, float]]
    method: str = ""
    samples: int = 0
    bins: int = 0

    def text(self) -> str:
        head = ["# tftpu calibration table", f"# method: {self.method}", f"# sample number: {self.samples}",
                f"# histogram number: {self.bins}", "###", "# op_name threshold min max"]
        rows = [f"{name} {_num(t)} {_num(lo)} {_num(hi)}" for name, (t, lo, hi) in self.entries.items()]
        return "\n".join(head + rows) + "\n"

    def save(self, path) -> None:
        """Write the table atomically."""
        write_text(path, self.text())

    def threshold(self, name: str) -> float:
        return self.entries[name][0]


def read_table(path) -> CalibrationTable:
    """Parse a table written by tftpu or TPU-MLIR; a ModelFileError names the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ModelFileError(path, "no such calibration table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not a readable calibration table ({exc})") from None
    entries: dict[str, tuple[float, float, float]] = {}
    meta = {}
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            key, _, value = text[1:].partition(":")
            meta[key.strip()] = value.strip()
            continue
        parts = text.split()
        try:
            if len(parts) < 4:
                raise ValueError
            values = tuple(float(p) for p in parts[1:4])
        except ValueError:
            raise ModelFileError(f"{path}:{no}", f"expected 'name threshold min max', got {text[:80]!r}") from None
        if not all(math.isfinite(v) for v in values) or values[0] < 0:
            raise ModelFileError(f"{path}:{no}", "threshold must be finite and >= 0, min/max finite")
        if parts[0] in entries:
            raise ModelFileError(f"{path}:{no}", f"tensor {parts[0]!r} listed twice")
        entries[parts[0]] = values
    if not entries:
        raise ModelFileError(path, "no calibration entries")
    samples = meta.get("sample number", "0")
    bins = meta.get("histogram number", "0")
    return CalibrationTable(entries, meta.get("method", ""), int(samples) if samples.isdigit() else 0,
                            int(bins) if bins.isdigit() else 0)
