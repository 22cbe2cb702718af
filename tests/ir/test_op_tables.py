"""Every table about ops is keyed by the op's full name and covers every op it should.

A second dialect (`tpu.Conv` beside `top.Conv`) must not collide with the first, so kernels,
FLOPs, layout rules and chip formats are keyed `top.Conv`, never `Conv`; and a new TOP op that
lacks a kernel or a layout rule fails here, not in a user's model.
"""

from __future__ import annotations

import pytest

from tftpu.interp.kernels import KERNELS
from tftpu.ir import base, layout, top
from tftpu.transforms import layout_rules as R

GRAPH_OPS = {"top.Input", "top.Weight", "top.None"}      # no computation: no kernel, no rule
COMPUTE = sorted(set(top.OPS_BY_NAME) - GRAPH_OPS)
KNOWN = set(top.OPS_BY_NAME) | {op.name for op in layout.Layout.operations}


def test_names_are_full_and_unique():
    assert all(name.startswith("top.") for name in top.OPS_BY_NAME)
    assert len({cls.name for cls in top.TOP_OPS}) == len(top.TOP_OPS)
    assert set(top.OPS_BY_NAME) == set(top.FLOPS)


@pytest.mark.parametrize("name", COMPUTE)
def test_every_compute_op_has_a_kernel(name):
    assert callable(KERNELS.get(name)), f"{name} has no inference kernel"


def test_kernel_keys_name_ops():
    assert set(KERNELS) <= KNOWN, sorted(set(KERNELS) - KNOWN)
    with pytest.raises(ValueError, match="full name"):
        from tftpu.interp.kernels import _registry
        _registry.register("Conv")(lambda operands, attrs: operands)


def test_layout_rules_cover_every_op():
    assert set(R.RULES) <= set(top.OPS_BY_NAME)
    # Permute is what ConvertLayout itself moves and merges; graph ops carry no layout
    assert set(COMPUTE) - set(R.RULES) == {"top.Permute"}
    assert not (R.AGNOSTIC & R.LIGHT or R.LIGHT & R.HEAVY or R.AGNOSTIC & R.HEAVY)


@pytest.mark.parametrize("cls", top.TOP_OPS, ids=lambda c: c.name)
def test_attributes_are_typed_with_accessors(cls):
    for key, spec in cls.ATTRS.items():
        assert isinstance(spec, base.AttrSpec), (cls.name, key)
        assert isinstance(getattr(cls, key), property), (cls.name, key)
    if "layout" in cls.ATTRS:
        assert cls.has_trait(base.LayoutSensitive)


def test_accessors_give_plain_values_with_defaults():
    from tftpu.ir import TopBuilder
    import numpy as np

    b = TopBuilder("m")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Conv", [x, b.weight("w", np.ones((4, 3, 3, 3), np.float32)), b.none()],
             {"kernel_shape": [3, 3], "strides": [2, 2]}, "y")
    conv = y.owner
    assert conv.group == 1 and conv.kernel_layout == "OIHW" and conv.strides == [2, 2]
    conv.group = 1
    assert conv.attrs()["pads"] == [0, 0, 0, 0]          # rank-dependent default
    assert top.Add.has_trait(base.Commutative) and not top.Sub.has_trait(base.Commutative)
    assert top.Relu.has_trait(base.Elementwise) and top.Conv.has_trait(base.Pure)


def test_onnx_converters_are_keyed_by_full_name_and_emit_known_ops():
    import importlib
    import inspect
    import re

    onnx_to_top = importlib.import_module("tftpu.frontend.onnx_to_top")

    assert onnx_to_top.CONVERTERS and all(k.startswith("onnx.") for k in onnx_to_top.CONVERTERS)
    emitted = set()
    for fn in set(onnx_to_top.CONVERTERS.values()):
        emitted |= set(re.findall(r'emit\(node, "([A-Za-z]+)"', inspect.getsource(fn)))
    assert emitted and {f"top.{n}" for n in emitted} <= set(top.OPS_BY_NAME), emitted


def test_chip_format_tables_name_real_ops():
    from tftpu import chip as chips

    for name in chips.known():
        formats = chips.load(name).formats
        ops = set(formats) - {"io", "default"}
        assert ops <= KNOWN, (name, sorted(ops - KNOWN))
        for op in COMPUTE:                       # every op resolves to a format on every chip
            assert chips.load(name).format_for(op).kind in ("NCHW", "NHWC", "lane_blocked")
