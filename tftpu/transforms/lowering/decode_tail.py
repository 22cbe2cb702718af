"""The decode tail: the ops after a model's last feature layers that only compute its outputs
(score sigmoids, softmax, a DFL softmax-expectation, box arithmetic, and the reshapes,
concats and splits between them). INT8 lowers them in float by design, as one small island:
the feature convs then write their logits on 16 bits into it (`tftpu.quant.links`), where an
8-bit grid shared by box and class logits would erase the low scores of a YOLO-style head.

A tail is made of data moves, scores (sigmoid, exp), a DFL's softmax and expectation, box
arithmetic and clamps, and pooled heads: a global average pool read (through moves) only by
matmuls, as a landmark or box regressor ends. The pool averages its input's rounding noise away,
an 8-bit grid on its output puts it back, and the matmul, whose outputs are small differences of
large products, amplifies it (mediapipe's hand landmarks: 14.6 dB in INT8, 24.4 dB with the pool
and matmuls in F16, for 0.1% of the FLOPs). It is kept only where it starts at feature layers
(convs, deconvs, matmuls), holds a score or an expectation (a tail of reshapes alone gains nothing
from float, and a classifier's pool, matmul and softmax stay INT8), and holds at most `SHARE` of
the model's FLOPs.
"""

from __future__ import annotations

import numpy as np

from tftpu.ir.base import value_name
from tftpu.transforms.lowering.int8_movement import MOVEMENT
from tftpu.transforms.lowering.int8_softmax import projects

__all__ = ["decode_tail", "tail_mode", "SHARE"]

SHARE = 0.01
F16_LIMIT = 65504.0 / 16           # calibrated ranges below this run in F16 with headroom to spare
_FEATURES = ("top.Conv", "top.Deconv", "top.MatMul")
_MOVES = (*MOVEMENT, "top.Concat", "top.Gather", "top.Pad")
# what a decode computes: scores, exp of box sizes, a DFL's softmax, box arithmetic and clamps
_SCORES = ("top.Sigmoid", "top.HardSigmoid", "top.Exp")
_DECODE = (*_MOVES, *_SCORES, "top.Softmax", "top.Add", "top.Sub", "top.Mul", "top.Div", "top.Clip")
_SKIP = ("top.Weight", "top.None", "top.Input")
_POOLS = ("top.GlobalAvgPool", "top.ReduceMean")
_POOLED = 4                        # values averaged per pooled output, at least
REASON = "decode tail: computes only the model's outputs after its last feature layer (float by design)"


def _expectation(model, op) -> bool:
    """Whether conv / matmul `op` is a DFL expectation: a Softmax's probabilities (through data
    moves) times a constant 0..N-1 projection (`int8_softmax.projects`, the Softmax's own rule)."""
    v = op.operands[0]
    while getattr(v.owner, "name", "") in _MOVES:
        v = v.owner.operands[0]
    soft, w = v.owner, op.operands[1].owner
    if getattr(soft, "name", "") != "top.Softmax" or getattr(w, "name", "") != "top.Weight":
        return False
    shape = soft.results[0].type.get_shape()
    return projects(op, np.asarray(model.weights[w.key]), shape[soft.attrs()["axis"] % len(shape)])


def decode_tail(model) -> dict[str, str]:
    """TOP op name -> why it runs in float, for each op of `model`'s decode tail (empty where
    the model has none)."""
    tail: set = set()
    heads = _pooled_heads(model)
    for op in reversed(list(model.ops)):
        if op.name in _SKIP or not op.results:
            continue
        users = [u.operation for r in op.results for u in r.uses]
        if not users or not all(u.name == "func.return" or u in tail for u in users):
            continue
        if not (op.name in _DECODE or op in heads or op.name in _FEATURES and _expectation(model, op)):
            continue
        tail.add(op)
    kept = set()
    for group in _components(tail):
        if any(op.name in _SCORES or op.name in _FEATURES for op in group) and _after_features(group):
            kept |= group
    total = sum(op.flops() for op in model.ops if op.name not in _SKIP)
    if not kept or total and sum(op.flops() for op in kept) > SHARE * total:
        return {}
    return {op.loc: REASON for op in model.ops if op in kept}


def _pooled_heads(model) -> set:
    """The ops of each pooled head: a global average pool (or a mean over at least `_POOLED`
    values per output), the moves after it, and the matmuls with constant weights that read it,
    none of them feeding a softmax."""
    heads: set = set()
    for op in model.ops:
        if op.name in _POOLS and op.results:
            src, out = op.operands[0].type.get_shape(), op.results[0].type.get_shape()
            if int(np.prod(src)) >= _POOLED * max(int(np.prod(out)), 1):
                heads |= _head_of(op)
    return heads


def _head_of(pool) -> set:
    """`pool`, the moves after it and the matmuls reading them, where nothing else reads them and
    a matmul is among them; else empty."""
    ops, todo = {pool}, [pool]
    while todo:
        for u in [u.operation for r in todo.pop().results for u in r.uses]:
            if u.name in _MOVES:
                todo.append(u)
            elif not (u.name == "top.MatMul" and getattr(u.operands[1].owner, "name", "") == "top.Weight"
                      and not _feeds_softmax(u)):
                return set()
            ops.add(u)
    return ops if any(o.name == "top.MatMul" for o in ops) else set()


def _feeds_softmax(op) -> bool:
    """Whether `op`'s result reaches a softmax through data moves and element-wise decode ops."""
    todo, seen = [op], set()
    while todo:
        for u in [u.operation for r in todo.pop().results for u in r.uses]:
            if u.name == "top.Softmax":
                return True
            if u in seen or u.name not in _DECODE:
                continue
            seen.add(u)
            todo.append(u)
    return False


def _after_features(group: set) -> bool:
    """Whether every activation entering `group` is a feature layer's output."""
    for op in group:
        for v in op.operands:
            src = v.owner
            name = getattr(src, "name", "")
            if src in group or name in ("top.Weight", "top.None"):
                continue
            if name not in _FEATURES:
                return False
    return True


def tail_mode(model, tail: dict, chip, table, fallback: str) -> str:
    """F16 where the chip runs it and every tensor of the tail is calibrated well inside its
    range (half the bytes of F32); else `fallback`."""
    if "F16" not in chip.modes or table is None:
        return fallback
    for op in model.ops:
        if op.loc not in tail:
            continue
        for r in op.results:
            entry = table.entries.get(value_name(r))
            if entry is None or max(abs(float(v)) for v in entry[:3]) > F16_LIMIT:
                return fallback
    return "F16"


def _components(ops: set) -> list[set]:
    """`ops` split into groups connected by the values they pass each other."""
    left, groups = set(ops), []
    while left:
        todo, group = [left.pop()], set()
        while todo:
            op = todo.pop()
            group.add(op)
            near = [v.owner for v in op.operands] + [u.operation for r in op.results for u in r.uses]
            for other in near:
                if other in left:
                    left.discard(other)
                    todo.append(other)
        groups.append(group)
    return groups
