"""The calibration table: per tensor, the INT8 threshold and the observed min and max.

Text in TPU-MLIR's layout (`# op_name threshold min max`, one tensor per line, in the model's
order), so its tables and ours read the same. No timestamp: the same calibration writes the
same bytes. An asymmetric table (header `# asymmetric: true`) holds in min/max the calibrated
range for INT8 asymmetric mode instead of the observed one, as TPU-MLIR's asymmetric mode reads
those columns. A table made by `auto` counts the methods it chose in the header.

A table may carry alternates: the tables other methods chose from the same statistics
(`calibrate(..., method="mse,tail_mse")`), which `tftpu.pipelines.deploy` builds the program
with, in order, where the one before misses its target. They follow the main rows as comment
lines, `#<method> op_name threshold min max`, which TPU-MLIR's reader skips.

>>> table = CalibrationTable({"conv1": (4.3, -4.178, 4.493)}, method="kl", samples=20)
>>> print(table.text().splitlines()[-1])
conv1 4.3 -4.178 4.493
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from tftpu.errors import ModelFileError, UsageError
from tftpu.utils.files import write_text

__all__ = ["CalibrationTable", "read_table"]


def _num(v: float) -> str:
    return f"{float(v):.9g}"


@dataclasses.dataclass
class CalibrationTable:
    """`entries`: tensor name -> (threshold, min, max), in model order; min/max are the calibrated
    asymmetric range when `asymmetric`. `chosen`: tensor name -> method, for `auto`."""

    entries: dict[str, tuple[float, float, float]]
    method: str = ""
    samples: int = 0
    bins: int = 0
    asymmetric: bool = False
    chosen: dict[str, str] = dataclasses.field(default_factory=dict)
    alternates: dict[str, "CalibrationTable"] = dataclasses.field(default_factory=dict)

    def tables(self) -> dict[str, "CalibrationTable"]:
        """method -> table, this one (without its alternates) first, then its alternates."""
        return {self.method: dataclasses.replace(self, alternates={}), **self.alternates}

    def to_json(self) -> dict:
        """The table as JSON-able data, every number exactly (`from_json` reads it back)."""
        return {"entries": [[n, *map(float, v)] for n, v in self.entries.items()], "method": self.method,
                "samples": self.samples, "bins": self.bins, "asymmetric": self.asymmetric, "chosen": self.chosen,
                "alternates": [t.to_json() for t in self.alternates.values()]}

    @classmethod
    def from_json(cls, data: dict) -> "CalibrationTable":
        alternates = [cls.from_json(a) for a in data.get("alternates", [])]
        return cls({e[0]: tuple(e[1:]) for e in data["entries"]}, data["method"], data["samples"], data["bins"],
                   asymmetric=data["asymmetric"], chosen=dict(data["chosen"]),
                   alternates={a.method: a for a in alternates})

    def counts(self) -> dict[str, int]:
        """How many tensors each method was chosen for (auto), by method name."""
        out: dict[str, int] = {}
        for m in self.chosen.values():
            out[m] = out.get(m, 0) + 1
        return dict(sorted(out.items()))

    def text(self) -> str:
        head = ["# tftpu calibration table", f"# method: {self.method}", f"# sample number: {self.samples}",
                f"# histogram number: {self.bins}"]
        if self.asymmetric:
            head.append("# asymmetric: true")
        if self.chosen:
            head.append("# auto chose: " + ", ".join(f"{m} {n}" for m, n in self.counts().items()))
        if self.alternates:
            head.append(f"# alternates: {' '.join(self.alternates)}")
        head += ["###", "# op_name threshold min max"]
        rows = [f"{name} {_num(t)} {_num(lo)} {_num(hi)}" for name, (t, lo, hi) in self.entries.items()]
        for method, alt in self.alternates.items():
            rows.append(f"# {method} thresholds: tftpu-deploy builds with them where those above miss the target")
            rows += [f"#{method} {name} {_num(t)} {_num(lo)} {_num(hi)}" for name, (t, lo, hi) in alt.entries.items()]
        return "\n".join(head + rows) + "\n"

    def save(self, path) -> None:
        """Write the table atomically."""
        write_text(path, self.text())

    def threshold(self, name: str) -> float:
        return self.entries[name][0]


def read_table(path) -> CalibrationTable:
    """Parse a table written by tftpu or TPU-MLIR; a ModelFileError names the file and line."""
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"calibration table {path!r}: expected a file path")
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ModelFileError(path, "no such calibration table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not a readable calibration table ({exc})") from None
    entries: dict[str, tuple[float, float, float]] = {}
    meta = {}
    alternates: dict[str, dict[str, tuple[float, float, float]]] = {}
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        into = entries
        if text.startswith("#"):
            method, _, row = text[1:].partition(" ")
            if method not in alternates:
                key, _, value = text[1:].partition(":")
                meta[key.strip()] = value.strip()
                if key.strip() == "alternates":
                    alternates = {m: {} for m in value.split()}
                continue
            into, text = alternates[method], row
        parts = text.split()
        try:
            if len(parts) < 4:
                raise ValueError
            values = tuple(float(p) for p in parts[1:4])
        except ValueError:
            raise ModelFileError(f"{path}:{no}", f"expected 'name threshold min max', got {text[:80]!r}") from None
        if not all(math.isfinite(v) for v in values) or values[0] < 0:
            raise ModelFileError(f"{path}:{no}", "threshold must be finite and >= 0, min/max finite")
        if values[1] > values[2]:
            raise ModelFileError(f"{path}:{no}", f"tensor {parts[0]!r}: min {parts[2]} is above max {parts[3]}")
        if values[0] == 0 and (values[1] or values[2]):
            raise ModelFileError(f"{path}:{no}", f"tensor {parts[0]!r}: threshold 0 for a range [{parts[2]}, {parts[3]}] "
                                                 "(a grid without a step)")
        if parts[0] in into:
            raise ModelFileError(f"{path}:{no}", f"tensor {parts[0]!r} listed twice")
        into[parts[0]] = values
    if not entries:
        raise ModelFileError(path, "no calibration entries")
    for method, rows in alternates.items():
        if not rows:
            raise ModelFileError(path, f"header '# alternates' names {method}, but no '#{method}' rows follow")
    samples = meta.get("sample number", "0")
    bins = meta.get("histogram number", "0")
    asym = meta.get("asymmetric", "false").lower()
    if asym not in ("true", "false"):
        raise ModelFileError(path, f"header '# asymmetric: {meta['asymmetric'][:20]}': expected true or false")
    common = dict(samples=int(samples) if samples.isdigit() else 0, bins=int(bins) if bins.isdigit() else 0,
                  asymmetric=asym == "true")
    return CalibrationTable(entries, meta.get("method", ""), **common,
                            alternates={m: CalibrationTable(rows, m, **common) for m, rows in alternates.items()})
