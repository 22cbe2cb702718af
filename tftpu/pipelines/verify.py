"""deploy's checks of what it built: the TPU model against TOP, tensor by tensor on the test input
and output by output (each concatenated part too) over the samples pooled (`verify`), and the
simulator against TPU-dialect inference (`check_simulator`: INT8 bit-equal)."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from tftpu.interp.similarity import compare_arrays, compare_tensors, noise_floor, parse_tolerance
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.transforms.lowering.search import judged_tensors, output_parts, part_slices

__all__ = ["verify", "check_simulator", "SimulatorRow"]


@dataclasses.dataclass
class SimulatorRow:
    """A failed simulator check as a row of DeployResult.failed (its name and what it found)."""

    data: dict
    passed: bool = False

    @property
    def name(self) -> str:
        return "simulator vs TPU inference"


def check_simulator(program, tpu_model, inputs: dict) -> dict:
    """The simulator's outputs against TPU-dialect inference: INT8 must be bit-equal, float modes
    within round-off (relative 1e-3 of each output's range)."""
    from tftpu.backend.simulator import Simulator

    t0 = time.perf_counter()
    got = Simulator(program).run(inputs)
    seconds = time.perf_counter() - t0
    ref = TpuInterpreter(tpu_model).run(inputs)
    rows, passed = [], True
    for name, want in ref.items():
        have = got[name]
        equal = bool(np.array_equal(np.asarray(want), have))
        diff = float(np.max(np.abs(np.asarray(want, np.float64) - have))) if want.size else 0.0
        scale = float(np.max(np.abs(np.asarray(want, np.float64)))) if want.size else 0.0
        ok = equal or (tpu_model.mode != "INT8" and diff <= 1e-3 * max(scale, 1e-30))
        passed &= ok
        rows.append({"output": name, "bit_exact": equal, "max_abs_diff": diff, "passed": ok})
    return {"passed": passed, "outputs": rows, "seconds": round(seconds, 3)}


def verify(top_model, tpu_model, samples: list[dict], tolerance, reference: dict | None = None):
    """(tensor comparison on the first sample, output rows over all samples, concat part rows).

    Outputs and parts are judged on the samples pooled, as the mixed-precision search judges
    them: an image whose output is near zero (a text map of a photo with no text) weighs by its
    output's energy, not as a whole image. With several samples, each row's note names the worst
    single sample. `reference` (the outputs of the first sample) replaces TOP's outputs when
    given."""
    tol = parse_tolerance(tolerance)
    top_run, tpu_run = TopInterpreter(top_model), TpuInterpreter(tpu_model)
    parts = output_parts(top_model)
    pooled: dict = {}                 # key -> (name, shape, [reference arrays], [TPU arrays])
    tensors = None
    floor = 0.0                       # the noise floor of every sample's tensors
    needed = judged_tensors(top_model, [spec for specs in parts.values() for spec in specs])
    for i, sample in enumerate(samples):
        ref = top_run.run(sample, dump_all=True)
        # every TPU tensor of the first sample (compared one by one), the judged ones of the rest
        got = tpu_run.run(sample, dump_all=i == 0, dequantize=True, keep=needed)
        floor = max(floor, noise_floor(ref.values()))
        if i == 0:
            tensors = compare_tensors(ref, got, tol, floor)
        for name in top_model.output_names:
            expected = reference[name] if (reference is not None and i == 0 and name in reference) else ref[name]
            _pool(pooled, name, name, expected, got[name])
        for out, specs in parts.items():
            for k, spec in enumerate(specs):
                label = out if k == 0 else spec[0]          # nested concats by their own name
                for (p, a), (_, b) in zip(part_slices(ref, spec), part_slices(got, spec)):
                    _pool(pooled, (out, label, p), f"{label}[{p}]", a, b)
    rows = {key: _pooled_row(name, shape, a, b, tol, floor) for key, (name, shape, a, b) in pooled.items()}
    grouped = [(out, [row for key, row in rows.items() if isinstance(key, tuple) and key[0] == out]) for out in parts]
    return tensors, [rows[n] for n in top_model.output_names], grouped


def _pool(pooled: dict, key, name: str, a, b) -> None:
    entry = pooled.setdefault(key, (name, tuple(np.shape(a)), [], []))
    entry[2].append(np.asarray(a))
    entry[3].append(np.asarray(b))


def _pooled_row(name: str, shape: tuple, refs: list, gots: list, tol, floor: float):
    """The row of one output (or part) over the samples pooled; the worst sample in its note."""
    if len(refs) == 1:
        return compare_arrays(name, refs[0], gots[0], tol, floor)
    each = [compare_arrays(name, a, b, tol, floor) for a, b in zip(refs, gots)]
    if any(math.isnan(r.cosine) for r in each):              # a shape, dtype or non-finite mismatch
        return min(each, key=lambda r: (r.passed, -math.inf if math.isnan(r.cosine) else r.cosine))
    row = compare_arrays(name, np.concatenate([np.ravel(a) for a in refs]),
                         np.concatenate([np.ravel(b) for b in gots]), tol, floor)
    if np.size(refs[0]) == 1:        # one value per sample: its own cosine and SQNR say nothing
        k = max(range(len(refs)), key=lambda i: abs(float(np.ravel(refs[i])[0]) - float(np.ravel(gots[i])[0])))
        note = (f"{len(refs)} samples pooled; largest error sample #{k} (#0 the test input): "
                f"{float(np.ravel(gots[k])[0]):.6g} for {float(np.ravel(refs[k])[0]):.6g}")
    else:
        k, worst = min(enumerate(each), key=lambda e: (e[1].sqnr, e[1].cosine))
        note = (f"{len(refs)} samples pooled; worst sample #{k} (#0 the test input): cosine {worst.cosine:.6f}, "
                f"SQNR {worst.sqnr:.1f} dB")
    return dataclasses.replace(row, shape=shape, note="; ".join(filter(None, [row.note, note])))
