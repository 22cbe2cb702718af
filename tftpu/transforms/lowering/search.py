"""Mixed precision: keep the fewest ops in float until the INT8 model's outputs reach a target.

Each INT8 op is ranked by the error it makes on its own (`ranking="isolated"`, the default):
run once on TOP's exact float inputs, quantized onto the grids it reads, its INT8 output is
compared with TOP's, over the first samples (one inference's worth of work for the whole
ranking). `ranking="alone"` ranks by TPU-MLIR's measure instead, the outputs with only that op
in INT8 (one inference per op: slower, usually fewer ops kept). A binary search over the
ranking then finds the shortest prefix to keep in float (F16 where the chip has it) whose
outputs, and every part of a concatenated output, reach the target, each judged over all
samples pooled. The result is a quantize table (TPU-MLIR's format).

>>> result = search_mixed_precision(model, "npu1", table, samples, "0.99,20")   # doctest: +SKIP
>>> print(result)                                                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from tftpu import chip as chips
from tftpu.errors import UsageError
from tftpu.interp.similarity import cosine_similarity, noise_floor, sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.transforms.lowering.lower import lower
from tftpu.utils.progress import progress

__all__ = ["search_mixed_precision", "MixedPrecisionResult", "parse_target", "output_parts", "part_slices"]

_CAP = 100.0        # dB: an exact tensor counts as this
RANK_SAMPLES = 4    # samples the per-op error is measured on
REACH_MARGIN_DB = 3.0  # an out-of-reach target becomes what all-float reaches, less this


def parse_target(text) -> tuple[float, float]:
    """'cosine,sqnr_db' -> (cosine, sqnr)."""
    try:
        cos, snr = (float(v) for v in str(text).split(","))
    except ValueError:
        raise UsageError(f"mixed precision target must be 'cosine,sqnr_db', e.g. 0.99,20, not {text!r}") from None
    if not (-1 <= cos <= 1) or math.isnan(snr):
        raise UsageError(f"mixed precision target {text!r}: cosine must lie in [-1, 1], SQNR be a number")
    return cos, snr


@dataclasses.dataclass
class MixedPrecisionResult:
    """The quantize table found, the ops it keeps in float (with their local SQNR drop), and
    the worst output figures reached."""

    qtable: dict
    kept: list                 # (op name, mode, output SQNR with only this op in INT8)
    target: tuple
    reached: tuple             # worst (cosine, sqnr) over outputs and parts, all samples
    int8_reached: tuple        # the same for pure INT8
    evaluations: int
    seconds: float
    candidates: int
    asked: tuple = ()          # the target as given (`target` is lowered when out of reach)
    all_float: tuple = ()      # worst (cosine, sqnr) with every candidate in float

    @property
    def met(self) -> bool:
        return self.reached[0] >= self.target[0] and self.reached[1] >= self.target[1]

    @property
    def out_of_reach(self) -> bool:
        """Whether the target asked for was out of reach even with every op in float."""
        return bool(self.asked) and tuple(self.asked) != tuple(self.target)

    @property
    def summary(self) -> str:
        c, s = self.reached
        c8, s8 = self.int8_reached
        if self.out_of_reach:
            fc, fs = self.all_float
            note = (f"the target {self.asked[0]},{self.asked[1]} dB is out of reach (every op in float reaches "
                    f"cosine {fc:.5f}, SQNR {fs:.1f} dB), so the search aims for {self.target[0]:.5f},"
                    f"{self.target[1]:.1f} dB: ")
        else:
            note = ""
        if not self.kept:
            return f"pure INT8 reaches the target (cosine {c8:.5f}, SQNR {s8:.1f} dB)"
        status = "reaches" if self.met else "does NOT reach"
        return note + (f"keeping {len(self.kept)} of {self.candidates} INT8 ops in float {status} the target "
                f"{self.target[0]},{self.target[1]} dB: cosine {c:.5f}, SQNR {s:.1f} dB "
                f"(pure INT8: {c8:.5f}, {s8:.1f} dB; {self.evaluations} trial lowerings, {self.seconds:.1f} s)")

    def __str__(self) -> str:
        lines = ["mixed precision: " + self.summary]
        for name, mode, snr in self.kept:
            lines.append(f"  {name}: {mode} (in INT8 on exact inputs its output reaches {snr:.1f} dB SQNR)")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"summary": self.summary, "target": list(self.target), "asked": list(self.asked or self.target),
                "reached": list(self.reached),
                "int8_reached": list(self.int8_reached), "met": self.met, "evaluations": self.evaluations,
                "seconds": round(self.seconds, 3),
                "kept": [{"name": n, "mode": m, "sqnr_isolated_int8_db": round(d, 3)} for n, m, d in self.kept]}


def _snr(a, b) -> float:
    v = sqnr(a, b)
    return _CAP if math.isinf(v) and v > 0 else min(v, _CAP)


def output_parts(model) -> dict[str, list[tuple[str, int, list[tuple[str, int]]]]]:
    """For each output made by a Concat (through reshapes): that Concat and every Concat nested
    in its parts, each as (its tensor, its axis, its parts as (name, extent along the axis)).
    One similarity for a whole output can hide a part the concatenation erased (scores beside
    boxes, even one level down): each slice is judged on its own."""
    producers = {r: op for op in model.ops for r in op.results}
    moves = {"top.Reshape", "top.Flatten", "top.Permute", "top.Squeeze", "top.Unsqueeze"}

    def concat_of(v):
        op = producers.get(v)
        while op is not None and op.name in moves:
            op = producers.get(op.operands[0])
        return op if op is not None and op.name == "top.Concat" and len(op.operands) > 1 else None

    parts = {}
    for v in model.return_op.operands:
        specs, stack, seen = [], [v], set()
        while stack:
            op = concat_of(stack.pop(0))
            if op is None or op in seen:
                continue
            seen.add(op)
            rank = len(op.results[0].type.get_shape())
            axis = op.attrs()["axis"] % rank
            specs.append((value_name(op.results[0]), axis,
                          [(value_name(x), x.type.get_shape()[axis]) for x in op.operands]))
            stack.extend(x for x in op.operands if not isinstance(x.owner, top.Weight))
        if specs:
            parts[value_name(v)] = specs
    return parts


def part_slices(tensors: dict, spec) -> list[tuple[str, np.ndarray]]:
    """(part name, slice of the concatenated tensor) for one `output_parts` entry."""
    name, axis, pieces = spec
    if name not in tensors:
        return []
    arr = np.asarray(tensors[name])
    out, start = [], 0
    for part, size in pieces:
        out.append((part, np.take(arr, range(start, start + size), axis=axis)))
        start += size
    return out


def _source(v):
    """The TPU value a cast converts (through any chain of casts): the tensor TOP names."""
    while v.owner.name == "tpu.Cast":
        v = v.owner.operands[0]
    return v


def isolated_errors(top_model, tpu_model, samples: list[dict], names: set) -> dict[str, float]:
    """Per INT8 op named in `names`: the worst SQNR (dB) of its output against TOP's when it runs
    on TOP's own inputs, quantized onto the grids it reads (its error alone, not inherited)."""
    from tftpu.interp.tpu import kernel_of
    from tftpu.interp.tpu.info import info_of
    from tftpu.ir import tpu
    from tftpu.rounding import quantize

    top_run = TopInterpreter(top_model)
    refs = [top_run.run(s, dump_all=True) for s in samples]
    weights = tpu_model.weights
    worst: dict[str, float] = {}
    for op in tpu_model.ops:
        if not isinstance(op, tpu.TpuOp) or not op.quantized:
            continue
        # a model output's producer is renamed NAME_i8 (its float cast keeps NAME)
        top_name = op.loc if op.loc in names else op.loc.rsplit("_", 1)[0]
        if top_name not in names:
            continue
        kernel = kernel_of(op)
        out_info = info_of(op.results[0].type)
        attrs = op.attrs()
        for ref in refs:
            operands = []
            for v in op.operands:
                if not hasattr(v.type, "get_shape"):
                    operands.append(None)
                elif isinstance(v.owner, top.Weight):
                    operands.append(weights[v.owner.key])
                else:
                    name = value_name(_source(v))
                    info = info_of(v.type)
                    if name not in ref:
                        break
                    x = ref[name]
                    operands.append(quantize(x, info.scale, info.zp, np.int8 if info.dtype == "i8" else np.uint8)
                                    if info.quantized else x)
            else:
                if top_name not in ref:
                    continue
                got = out_info.dequantize(np.asarray(kernel(operands, attrs)[0]))
                worst[top_name] = min(worst.get(top_name, _CAP), _snr(ref[top_name], got))
    return worst


RANKINGS = ("isolated", "alone")


def _search(model, chip, table, samples, target, asymmetric, qtable, float_mode, ranking) -> MixedPrecisionResult:
    t0 = time.perf_counter()
    chip = chips.load(chip)
    cos_t, snr_t = parse_target(target)
    if "INT8" not in chip.modes:
        raise UsageError(f"chip {chip.name} has no INT8 mode to search from")
    fmode = float_mode or next((m for m in ("F16", "BF16", "F32") if m in chip.modes), None)
    if fmode is None:
        raise UsageError(f"chip {chip.name} has no float mode to keep ops in")
    base = dict(qtable or {})
    parts = [spec for specs in output_parts(model).values() for spec in specs]
    ref_run = TopInterpreter(model)
    needed = set(model.output_names) | {spec[0] for spec in parts}
    refs = [{k: v for k, v in ref_run.run(s, dump_all=bool(parts)).items() if k in needed} for s in samples]
    # rounding noise is judged against the outputs' scale over every sample: an output that is
    # zero up to rounding on one sample (an empty mask) says nothing about precision
    floor = noise_floor(v for ref in refs for v in ref.values())
    evaluations = 0

    def evaluate(extra: dict, n_samples: int | None = None) -> tuple[tuple[float, float], object]:
        """Worst (cosine, SQNR) over the judged tensors, each pooled over the samples."""
        nonlocal evaluations
        evaluations += 1
        tpu_model, report = lower(model, chip, "INT8", table, qtable={**base, **extra}, asymmetric=asymmetric)
        run = TpuInterpreter(tpu_model)
        pooled: dict = {}
        for s, ref in list(zip(samples, refs))[:n_samples]:
            got = run.run(s, dump_all=bool(parts), dequantize=True)
            pairs = [(n, ref[n], got[n]) for n in model.output_names]
            for spec in parts:
                pairs += [(f"{spec[0]}[{p}]", a, b)
                          for (p, a), (_, b) in zip(part_slices(ref, spec), part_slices(got, spec))]
            for n, a, b in pairs:
                pooled.setdefault(n, ([], []))
                pooled[n][0].append(np.ravel(a))
                pooled[n][1].append(np.ravel(b))
        worst_c, worst_s = 1.0, _CAP
        for a, b in pooled.values():
            a, b = np.concatenate(a), np.concatenate(b)
            if float(np.max(np.abs(a))) <= floor and float(np.max(np.abs(a - b))) <= floor:
                continue                                  # zero up to rounding on both sides
            worst_c = min(worst_c, cosine_similarity(a, b))
            worst_s = min(worst_s, _snr(a, b))
        return (worst_c, worst_s), report

    def meets(r) -> bool:
        return r[0] >= cos_t and r[1] >= snr_t

    int8_reached, report = evaluate({})
    int8_ops = [d.name for d in report.decisions if d.mode == "INT8" and d.name not in base]
    if meets(int8_reached) or not int8_ops:
        return MixedPrecisionResult({**base}, [], (cos_t, snr_t), int8_reached, int8_reached, evaluations,
                                    time.perf_counter() - t0, len(int8_ops), (cos_t, snr_t))
    if ranking == "alone":                       # each op alone in INT8, every other candidate in float
        alone = {}
        for name in progress(int8_ops, desc="mixed precision: op sensitivity", unit="op"):
            (_, snr), _ = evaluate({n: fmode for n in int8_ops if n != name}, n_samples=RANK_SAMPLES)
            alone[name] = snr
    else:
        tpu_model, _ = lower(model, chip, "INT8", table, qtable=base, asymmetric=asymmetric)
        alone = isolated_errors(model, tpu_model, samples[:RANK_SAMPLES], set(int8_ops))
    ranked = sorted(((name, alone.get(name, _CAP)) for name in int8_ops), key=lambda t: (t[1], t[0]))
    lo, hi = 0, len(ranked)                          # invariant: keeping `hi` ops meets (checked below)
    reached_hi, _ = evaluate({n: fmode for n, _ in ranked})
    best = reached_hi
    asked = (cos_t, snr_t)
    if not meets(reached_hi):
        # out of reach by precision alone (even every op in float falls short: outputs that are
        # nearly constant, or a reference the float mode itself cannot follow): aim for what
        # all-float reaches, less REACH_MARGIN_DB, rather than keeping every op in float
        cos_t = min(cos_t, reached_hi[0] - (1.0 - reached_hi[0]))
        snr_t = min(snr_t, reached_hi[1] - REACH_MARGIN_DB)
    if meets(reached_hi):
        steps = progress(range(max(1, math.ceil(math.log2(len(ranked) + 1)))), desc="mixed precision search",
                         unit="trial")
        it = iter(steps)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            reached, _ = evaluate({n: fmode for n, _ in ranked[:mid]})
            next(it, None)
            if meets(reached):
                hi, best = mid, reached
            else:
                lo = mid
    kept = [(n, fmode, snr) for n, snr in ranked[:hi]]
    return MixedPrecisionResult({**base, **{n: m for n, m, _ in kept}}, kept, (cos_t, snr_t), best, int8_reached,
                                evaluations, time.perf_counter() - t0, len(int8_ops), asked, reached_hi)


def search_mixed_precision(model, chip, table, samples: list[dict], target, *, asymmetric: bool = False,
                           qtable: dict | None = None, float_mode: str | None = None,
                           ranking: str = "isolated") -> MixedPrecisionResult:
    """The shortest list of ops (along the ranking) to keep in float for the INT8 model to
    reach `target` ("cosine,sqnr_db"), judged over the samples pooled. `ranking`: "isolated"
    (each op's own error on exact inputs, one inference in all) or "alone" (the outputs with
    only that op in INT8: one inference per op, slower, usually fewer ops kept)."""
    if ranking not in RANKINGS:
        raise UsageError(f"mixed precision ranking {ranking!r}: expected one of {', '.join(RANKINGS)}")
    if not samples:
        raise UsageError("the mixed precision search needs at least one sample input")
    if table is None:
        raise UsageError("the mixed precision search needs a calibration table")
    return _search(model, chip, table, samples, target, asymmetric, qtable, float_mode, ranking)
