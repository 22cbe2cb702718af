"""Calibration judged at the outputs (`tftpu.compile(calibration_method="mse,minmax")`,
`tftpu-calibrate --calibration_method=mse,minmax`): one statistics pass, a table per method,
and the table whose all-INT8 program comes nearest the float outputs on the test input and
samples kept.

A method that is best for each tensor on its own need not be best for the model: `mse` clips a
tensor's rare large values to round the common ones finer, and a detector's head carries its
objects in exactly those values, while other models lose more to `minmax`'s coarser grid
(docs/guides/quantize.md has the figures). The judged program is the plain all-INT8 lowering
(no equalization, refit or conv links), which is what makes the choice cheap and also why it is
not `tftpu.compile`'s default: on the detectors measured it did not predict which table the
finally lowered program does better with."""

from __future__ import annotations

import dataclasses
import time

from tftpu import errors

__all__ = ["CALIBRATION_DEFAULT", "CHOICE_MARGIN", "methods_of", "Chosen", "choose_table"]

CALIBRATION_DEFAULT = "mse"
# a method listed later is kept only where it beats the one kept so far by this much (dB), as
# equalization's margin: a small lead of the plain all-INT8 program need not survive the rest
CHOICE_MARGIN = 1.0


def methods_of(spec) -> tuple[str, ...]:
    """The methods of a `calibration_method` string ("mse", or several: "mse,minmax"), checked."""
    from tftpu.quant import CALIBRATION_METHODS

    if not isinstance(spec, str) or not spec.strip():
        raise errors.UsageError(f"calibration_method {spec!r}: expected one of {', '.join(CALIBRATION_METHODS)}, "
                                "or several joined by commas (each judged at the outputs, the best kept)")
    methods = tuple(dict.fromkeys(m.strip() for m in spec.split(",")))
    for m in methods:
        if m not in CALIBRATION_METHODS:
            raise errors.UsageError(f"calibration_method {m!r}: expected one of {', '.join(CALIBRATION_METHODS)}")
    return methods


@dataclasses.dataclass
class Chosen:
    """The method kept, its table, each method's judged figure (dB) and the verdict line."""

    method: str
    table: object
    figures: dict
    line: str
    seconds: float


def choose_table(top_model, tables: dict, held: list[dict], chip, asymmetric) -> Chosen:
    """Of `tables` (method -> table, in order of preference), the one whose all-INT8 program's
    worst output (or part) SQNR on `held` (the test input first), pooled and on the test input
    alone, is highest, a later method needing `CHOICE_MARGIN` more than the one kept before it."""
    from tftpu.pipelines.judge import Judge
    from tftpu.transforms.lowering import lower

    t0 = time.perf_counter()
    judge = Judge(top_model, held)
    figures = {m: min(judge(lower(top_model, chip, "INT8", t, asymmetric=asymmetric)[0])) for m, t in tables.items()}
    best = next(iter(tables))
    for m in tables:
        if figures[m] > figures[best] + CHOICE_MARGIN:
            best = m
    line = ("all INT8 judged on " + judge.where + ": " + ", ".join(f"{m} {figures[m]:.2f} dB" for m in tables)
            + f"; {best} kept (a later method needs {CHOICE_MARGIN:g} dB more)")
    return Chosen(best, tables[best], figures, line, time.perf_counter() - t0)
