"""16-bit weights for the depthwise convs where the weights' 8-bit rounding is what holds a
program under its target (`tftpu.pipelines.deploy`, `wide_links="auto"`).

A depthwise kernel has a handful of weights per channel, one per-channel scale set by the
largest, and its output is a sharp filter of its input: a near-identity kernel with a large
gain (a big centre tap, small neighbours whose sum carries the detail) loses that detail to
8-bit rounding, and no refit mends it (the refit's weights reach the same grid). PP-OCRv3's
text detector: one 3x3 depthwise conv's rounding alone costs its text photo 17.2 dB. Sixteen-bit
weights (two INT8 passes over their byte planes, `tftpu.quant.links.WideWeights`) cost a
depthwise conv little: few multiply-adds an output."""

from __future__ import annotations

import math

from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.quant.links import InputConvs, WideWeights
from tftpu.transforms.lowering.lower import FOUR_PASSES, WIDE_WEIGHTS

__all__ = ["WEIGHTS_GAIN", "depthwise_weights", "depthwise_int8", "weights_alone", "with_wide_weights"]

# the depthwise convs' 16-bit weights are tried (one more lowering) only where they lift the
# weights' rounding alone by this many dB (worst part), and each conv so only where its own do
WEIGHTS_GAIN = 1.0
# each measured so (a float run of the judged inputs): at most this many, those whose own output
# their weights' rounding moves most on the test input
MEASURED = 3


def depthwise_weights(top_model, chip, table, qtable, asymmetric, float_tail: bool, links, plain, judge,
                      need: float, budget: float, refit: bool = False):
    """(links, note, latency before, latency with them, the all-INT8 lowering with them), or None:
    `links` with 16-bit weights for the depthwise convs in INT8 where the all-INT8 program
    (`plain`, lowered with `links`, or None) misses `need` dB by `judge`, its weights' rounding
    alone misses it too, and 16-bit weights for them all lift that by `WEIGHTS_GAIN` dB: those convs
    whose own 16-bit weights lift it as much, within `budget` times the latency before them, and
    where the program they make is judged no worse, or a `refit` follows: the refit fits the
    weights anew, so all INT8 judged before it says little (PP-OCRv3's text detector: 16-bit
    weights for its one depthwise conv that passes, all INT8 11.5 -> 9.3 dB before the refit,
    17.4 -> 19.0 dB after it on its held-out photo)."""
    from tftpu.pipelines.conv_links import program_profile
    from tftpu.transforms.lowering import lower

    def lowered(with_links):
        return lower(top_model, chip, "INT8", table, qtable=qtable, asymmetric=asymmetric, wide_links=with_links,
                     float_tail=float_tail)

    if links in (False, "convs"):
        return None
    plain = plain or lowered(links)
    reached = min(judge(plain[0]))
    names = depthwise_int8(top_model, plain[1].decisions)
    if reached >= need or not names:
        return None
    now = weights_alone(judge, top_model, plain[1].decisions)
    wide = weights_alone(judge, top_model, plain[1].decisions, names)
    if min(now) >= need or min(wide) < min(now) + WEIGHTS_GAIN:
        return None
    # each conv whose own 16-bit weights lift the figure as much (most convs' rounding is lost in
    # their inputs' noise, and the INT8 program's rounding changes with every conv it touches)
    local = local_sqnr(top_model, names, judge.held[0])
    measured = sorted(names, key=lambda n: (local[n], n))[:MEASURED]
    names = frozenset(n for n in measured
                      if min(weights_alone(judge, top_model, plain[1].decisions, {n})) >= min(now) + WEIGHTS_GAIN)
    if not names:
        return None
    wide = weights_alone(judge, top_model, plain[1].decisions, names)
    w16 = with_wide_weights(links, names)
    built = lowered(w16)
    before, after = program_profile(plain[0], chip).latency_us, program_profile(built[0], chip).latency_us
    ratio = after / max(before, 1e-9)
    judged = min(judge(built[0]))
    if ratio > budget or judged < reached and not refit:
        return None
    note = (f"16-bit weights for the {len(names)} depthwise conv{'s' if len(names) > 1 else ''} in INT8 (two "
            f"INT8 passes): the weights' rounding alone {min(now):.1f} -> {min(wide):.1f} dB, all INT8 "
            f"{reached:.1f} -> {judged:.1f} dB{' before the refit' if refit else ''}, estimated latency {ratio:.3f}x")
    return w16, note, before, after, built


def depthwise_int8(top_model, decisions) -> frozenset:
    """The depthwise convs (one filter per input channel, constant weights) that `decisions`
    lower to INT8 with 8-bit weights."""
    int8 = {d.name for d in decisions if d.mode == "INT8" and d.reason not in (WIDE_WEIGHTS, FOUR_PASSES)}
    names = set()
    for op in top_model.ops:
        if not isinstance(op, top.Conv) or op.loc not in int8 or not isinstance(op.operands[1].owner, top.Weight):
            continue
        shape = op.operands[0].type.get_shape()
        group = int(op.attrs().get("group", 1) or 1)
        if len(shape) == 4 and group > 1 and group == shape[1]:
            names.add(op.loc)
    return frozenset(names)


def local_sqnr(top_model, names, sample: dict) -> dict:
    """SQNR (dB) of each conv `names`'s output with its weights on their 8-bit grid against its
    float output, on `sample` (its float input, every other weight as it is)."""
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.quant.bias_correction import _quantized_weight

    ops = {op.loc: op for op in top_model.ops if op.loc in names}
    run = TopInterpreter(top_model)
    wanted = {value_name(ops[n].operands[0]) for n in ops}
    tensors = run.run(sample, keep=wanted)
    out = {}
    for kernel, ins, _, attrs, _, loc in run.steps:
        if loc not in ops:
            continue
        args = [None if s is None else run.consts[s] if s in run.consts else tensors[run.names[s]] for s in ins]
        rounded = list(args)
        rounded[1] = _quantized_weight(ops[loc], args[1])
        attrs = dict(attrs, do_relu=False)
        out[loc] = float(sqnr(kernel(args, attrs)[0], kernel(rounded, attrs)[0]))
    return out


def weights_alone(judge, top_model, decisions, wide: frozenset = frozenset()) -> tuple[float, float]:
    """(pooled, test input alone) worst SQNR of `top_model` with its INT8 ops' weights (per
    `decisions`) rounded to nearest on their grids and run in float (`judge.float_run`): what
    the weights' rounding alone costs; `wide`: more convs given 16-bit weights."""
    from tftpu.quant.bias_correction import lowered_weights

    sixteen = {d.name for d in decisions if d.reason in (WIDE_WEIGHTS, FOUR_PASSES)} | set(wide)
    figures = judge.float_run(lowered_weights(top_model, {d.name for d in decisions if d.mode == "INT8"}, sixteen))
    return tuple(-math.inf if math.isnan(v) else v for v in figures)


def with_wide_weights(links, names) -> frozenset:
    """The `wide_links` value `links` (True, "tables", or a set) with 16-bit weights for the
    convs `names` as well; the links themselves unchanged."""
    extra = {WideWeights(n) for n in names}
    if links is True:
        return InputConvs(extra)                 # (the default links, no tables, no conv reading 16 bits)
    if links == "tables":
        return frozenset(extra)
    if isinstance(links, (set, frozenset)):
        return type(links)(set(links) | extra) if isinstance(links, InputConvs) else frozenset(set(links) | extra)
    raise ValueError(f"no 16-bit weights with wide_links={links!r}")
