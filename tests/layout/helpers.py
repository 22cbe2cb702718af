"""Small TOP graphs for layout tests: NHWC data wrapped in tf2onnx-style permutes, a checker."""

from __future__ import annotations


import numpy as np

from tftpu.interp.top_interpreter import run
from tftpu.ir import top
from tftpu.ir.module import TopBuilder, TopModel, parse_module
from tftpu.transforms.convert_layout import ConvertLayout, convert_layout

TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(shape, seed: int = 0) -> np.ndarray:
    return rng(seed).standard_normal(shape).astype(np.float32)


def clone(model: TopModel) -> TopModel:
    """A deep copy through the text form (the pass rewrites in place)."""
    return TopModel(parse_module(model.text()), {k: v.copy() for k, v in model.weights.items()})


def inputs_for(model: TopModel, seed: int = 0) -> dict:
    out = {}
    for i, op in enumerate(o for o in model.ops if isinstance(o, top.Input)):
        shape = tuple(op.output.type.get_shape())
        out[op.loc] = randn(shape, seed + i)
    return out


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb))


def permutes(model: TopModel) -> list:
    return [op for op in model.ops if isinstance(op, top.Permute)]


def convert_and_compare(model: TopModel, desired=None, layout: str | None = None, seed: int = 0,
                        atol: float = 1e-5):
    """Apply the pass to a copy; assert outputs and their names unchanged; return (new model, report)."""
    feeds = inputs_for(model, seed)
    ref = run(model, feeds)
    new = clone(model)
    if desired is not None:
        report = ConvertLayout(desired).apply(new)
    else:
        report = convert_layout(new, layout=layout or "NHWC")
    got = run(new, feeds)
    assert list(got) == list(ref), (list(got), list(ref))
    for k in ref:
        assert got[k].shape == ref[k].shape, k
        # float32 round-off grows with the magnitudes summed: scale atol by the output's range
        scale = max(1.0, float(np.abs(ref[k]).max())) if ref[k].size else 1.0
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=atol * scale, err_msg=k)
        assert cosine(got[k], ref[k]) >= 0.99999
    for op in permutes(new):
        assert not isinstance(op.operands[0].owner, top.Weight), "a weight is transposed at run time"
    return new, report


def wrapped(op_name: str, attrs: dict, nhwc_shape=(1, 6, 8, 4), back: bool = True, extra=None,
            perm=TO_NCHW, name: str = "t"):
    """x (NHWC) -> Permute(perm) -> op(attrs) [-> Permute(inverse)] -> output."""
    b = TopBuilder(name)
    x = b.input("x", nhwc_shape)
    xp = b.op("Permute", [x], {"order": list(perm)}, "x_t")
    operands = [xp] + [e(b) if callable(e) else e for e in (extra or [])]
    y = b.op(op_name, operands, attrs, "y")
    outs = y if isinstance(y, list) else [y]
    if back:
        res = []
        for i, o in enumerate(outs):
            rank = len(o.type.get_shape())
            inv = list(np.argsort(perm)) if rank == len(perm) else None
            res.append(b.op("Permute", [o], {"order": [int(v) for v in inv]}, f"out{i}") if inv else o)
        outs = res
    return b.finish(outs)


def feeder(model: TopModel, op_name: str):
    """The op of `model` named top.<op_name> (the one under test) and what feeds its operand 0."""
    ops = [op for op in model.ops if op.name == f"top.{op_name}"]
    assert ops, f"no top.{op_name} left"
    return ops[0], ops[0].operands[0].owner
