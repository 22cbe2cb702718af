"""Equalization as pipeline steps (`tftpu.compile` and `deploy` run them): depthwise input
equalization (`tftpu.quant.equalize`: its new tensors calibrated, the float program checked
unchanged, and under "auto" the all-INT8 programs with and without it judged) and, on request,
cross-layer equalization (`tftpu.quant.cross_layer`: its tensors calibrated again, the float
program checked unchanged)."""

from __future__ import annotations

import dataclasses
import time

from tftpu import errors

__all__ = ["equalize_step", "cross_layer_step", "check_equalize", "check_cross_layer", "Equalized", "EQUALIZE",
           "EQUALIZE_MARGIN", "SAME_FLOAT"]

EQUALIZE = (False, True, "auto")
# under "auto", the equalized all-INT8 program must beat the plain one by this much (dB) on the
# judge: a smaller gain there did not carry over to the program finally lowered (measured: the
# pose detector judged +0.4 dB, then lost 1.6 dB on its held-out photo after the search)
EQUALIZE_MARGIN = 1.0
# the equalized float program against the given one: the largest relative output difference allowed
SAME_FLOAT = 1e-4


@dataclasses.dataclass
class Equalized:
    """What the step did: the model and table to go on with (the given ones where not kept)."""

    model: object
    table: object
    line: str                  # what was equalized, the float check and the verdict
    passed: bool               # the float program unchanged
    seconds: float


def check_equalize(equalize) -> None:
    """A UsageError unless `equalize` is one of `EQUALIZE`."""
    if equalize not in EQUALIZE:
        raise errors.UsageError(f"equalize={equalize!r}: expected True, False or 'auto'")


def check_cross_layer(cross_layer) -> None:
    """A UsageError unless `cross_layer` is True or False."""
    if cross_layer not in (True, False):
        raise errors.UsageError(f"cross_layer={cross_layer!r}: expected True or False")


def equalize_step(top_model, table, samples, check, chip, asymmetric, method: str, equalize) -> Equalized | None:
    """`top_model` with its depthwise conv inputs equalized on `samples` (input dicts), its new
    tensors calibrated by `method`, where `equalize` is True, or "auto" and its all-INT8 program
    judged better than the plain one's by `EQUALIZE_MARGIN` on `check` and the samples; None where
    no conv input applies."""
    from tftpu.pipelines.judge import Judge
    from tftpu.quant.equalize import equalize_depthwise
    from tftpu.transforms.lowering import lower

    check_equalize(equalize)
    t0 = time.perf_counter()
    eq = equalize_depthwise(top_model, samples)
    if not eq.factors:
        return None
    eq_table, diff = _recalibrated(top_model, eq.model, table, eq.products.values(), samples, check, method,
                                   asymmetric)
    line = f"{eq}; equalized TOP vs TOP: max relative difference {diff:.1e}"
    passed = diff <= SAME_FLOAT
    keep = passed
    if equalize == "auto" and passed:
        judge = Judge(top_model, [check] + [x for x in samples if x is not check][:8])
        plain = min(judge(lower(top_model, chip, "INT8", table, asymmetric=asymmetric)[0]))
        mine = min(judge(lower(eq.model, chip, "INT8", eq_table, asymmetric=asymmetric)[0]))
        keep = mine > plain + EQUALIZE_MARGIN
        line += f"; all INT8 judged {mine:.2f} dB against {plain:.2f} dB on {judge.where}, " + \
            ("kept" if keep else "not kept")
    seconds = time.perf_counter() - t0
    if keep:
        return Equalized(eq.model, eq_table, line, passed, seconds)
    return Equalized(top_model, table, line, passed, seconds)


def cross_layer_step(top_model, table, samples, check, method: str, asymmetric) -> Equalized | None:
    """`top_model` with its conv outputs equalized across layers on `samples`
    (`tftpu.quant.cross_layer`), those tensors calibrated again by `method`, kept where the float
    program is unchanged; None where no conv output applies."""
    from tftpu.quant.cross_layer import equalize_cross_layer

    t0 = time.perf_counter()
    eq = equalize_cross_layer(top_model, samples)
    if not eq.factors:
        return None
    eq_table, diff = _recalibrated(top_model, eq.model, table, eq.factors, samples, check, method, asymmetric)
    passed = diff <= SAME_FLOAT
    line = (f"{eq}; equalized TOP vs TOP: max relative difference {diff:.1e}, "
            + ("kept" if passed else "not kept"))
    seconds = time.perf_counter() - t0
    if passed:
        return Equalized(eq.model, eq_table, line, passed, seconds)
    return Equalized(top_model, table, line, passed, seconds)


def _recalibrated(top_model, eq_model, table, names, samples, check, method: str, asymmetric) -> tuple:
    """(`table` with the tensors `names` of `eq_model` calibrated on `samples` by `method`, the
    largest relative output difference of `eq_model` from `top_model` on `check`)."""
    from tftpu import quant
    from tftpu.interp.similarity import max_relative_difference
    from tftpu.interp.top_interpreter import TopInterpreter

    fresh = quant.calibrate(eq_model, samples, method, asymmetric=bool(asymmetric))
    eq_table = dataclasses.replace(table, entries={**table.entries, **{name: fresh.entries[name] for name in names}})
    diff = max_relative_difference(TopInterpreter(top_model).run(check), TopInterpreter(eq_model).run(check),
                                   top_model.output_names)
    return eq_table, diff
