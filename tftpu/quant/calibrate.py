"""Calibration: run the TOP model on sample inputs and choose each tensor's INT8 threshold.

Two passes over the samples, as TPU-MLIR does: the first records every float tensor's min,
max and largest |x|; the second fills a histogram of the non-zero |x| over [0, largest |x|] per
tensor (exact zeros, ReLU's or padding's, quantize without error and would swamp the first bin,
as TPU-MLIR also finds), from which the method (see `tftpu.quant.thresholds`) picks the threshold. Every tensor is keyed by
its location name, so the table lines up with the `.mlir` and with `tftpu-run` dumps.

>>> table = calibrate(model, samples, method="mse")  # doctest: +SKIP
>>> table.save("resnet_cali_table")                   # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from tftpu.errors import InputError, UsageError
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.quant.table import CalibrationTable
from tftpu.quant.thresholds import METHODS, threshold
from tftpu.utils.progress import progress

__all__ = ["calibrate", "BINS"]

BINS = 2048


def calibrate(model, samples: list[dict], method: str = "mse", bins: int = BINS) -> CalibrationTable:
    """A CalibrationTable for every float tensor of `model` over `samples` (input dicts).

    `method` defaults to mse: on mtcnn O-Net with its real weights, kl's thresholds cost 1.5% of
    the face/non-face accuracy in simulated INT8 and mse's none (`benchmarks/calibration_quality.py`).
    """
    if method not in METHODS:
        raise UsageError(f"calibration method {method!r}: expected one of {', '.join(METHODS)}")
    if not samples:
        raise InputError("calibration needs at least one sample input")
    if bins <= 128:
        raise UsageError(f"bins {bins}: use more than 128")
    interp = TopInterpreter(model)
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for sample in progress(samples, desc="calibration statistics", unit="input"):
        for name, arr in interp.run(sample, dump_all=True).items():
            if arr.dtype.kind != "f" or arr.size == 0:
                continue
            a = arr.astype(np.float64, copy=False)
            lo[name] = min(lo.get(name, np.inf), float(a.min()))
            hi[name] = max(hi.get(name, -np.inf), float(a.max()))
    absmax = {n: max(abs(lo[n]), abs(hi[n])) for n in lo}
    hists = {n: np.zeros(bins, np.int64) for n in lo}
    for sample in progress(samples, desc="calibration histograms", unit="input"):
        for name, arr in interp.run(sample, dump_all=True).items():
            if name in hists and absmax[name] > 0:
                mags = np.abs(arr.astype(np.float64, copy=False)).ravel()
                counts, _ = np.histogram(mags[mags != 0], bins, (0.0, absmax[name]))
                hists[name] += counts
    entries = {n: (threshold(method, hists[n], absmax[n]), lo[n], hi[n])
               for n in progress(list(lo), desc=f"{method} thresholds", unit="tensor")}
    return CalibrationTable(entries, method, len(samples), bins)
