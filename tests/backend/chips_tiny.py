"""Test helpers for the layer-group, codegen and simulator tests: chips with a tiny local memory
(so that even small models are sliced along H with halos), a fixed model with every local op
kind the planner slices, and the local/DDR footprint of one command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from tftpu.backend.layer_group import lane_bytes
from tftpu.ir import TopBuilder
from tftpu.ir import attrs as A
from tftpu.ir.base import numel, value_name
from tftpu.utils import config

CONFIGS = config.DEFAULT_ROOT / "chips"


def tiny_chip(directory, per_lane: int, base: str = "edge16") -> str:
    """Path of a copy of chip `base` with `per_lane` bytes of local memory per lane."""
    data = yaml.safe_load((CONFIGS / f"{base}.yaml").read_text())
    data["name"] = f"{base}_tiny{per_lane}"
    data["local_mem_bytes"] = data["npu_lanes"] * per_lane
    path = Path(directory) / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def zoo(batch: int = 2, size: int = 24, seed: int = 0, ceil_mode: bool = False):
    """A TOP model with 3x3/s1, 3x3/s2 (pads 1), 5x5 dilated and depthwise convs, a residual
    add of two branches, max and average pools with pads (count_include_pad both ways), a
    ceil-mode max pool (with `ceil_mode`), channel concats, a sigmoid, a squeeze-excite multiply
    and a global average pool; outputs the pooled vector and a map from the middle of the model."""
    rng = np.random.default_rng(seed)
    b = TopBuilder("zoo")

    def w(name, shape):
        fan_in = numel(shape[1:]) if len(shape) > 1 else 1
        return b.weight(name, rng.normal(0, 1 / np.sqrt(fan_in), size=shape).astype(np.float32))

    def conv(name, x, cin, cout, k, stride=1, pad=0, dilation=1, group=1, relu=False, bias=True):
        return b.op("Conv", [x, w(name + "_w", (cout, cin // group, k, k)), w(name + "_b", (cout,)) if bias
                             else b.none()],
                    {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4,
                     "dilations": [dilation, dilation], "group": group, "do_relu": relu}, name)

    x = b.input("x", (batch, 3, size, size))
    c1 = conv("c1", x, 3, 8, 3, pad=1, relu=True)
    c2 = conv("c2", c1, 8, 8, 3, stride=2, pad=1, bias=False)
    c3 = conv("c3", c2, 8, 8, 5, pad=4, dilation=2, relu=True)
    dw = conv("dw", c3, 8, 8, 3, pad=1, group=8)
    res = b.op("Add", [c2, dw], {"do_relu": True}, "res")
    mp = b.op("MaxPool", [res], {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, "mp")
    ap = b.op("AvgPool", [res], {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                 "count_include_pad": True}, "ap")
    ap2 = b.op("AvgPool", [res], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0],
                                  "count_include_pad": False}, "ap2")
    if ceil_mode:
        mpc = b.op("MaxPool", [res], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": True}, "mpc")
        up = conv("up", b.op("Concat", [ap2, mpc], {"axis": 1}, "cat2"), 16, 8, 1)
    else:
        up = conv("up", ap2, 8, 8, 1)
    cat = b.op("Concat", [mp, ap], {"axis": 1}, "cat")
    c4 = conv("c4", cat, 16, 12, 3, stride=2, pad=1, relu=True)
    sig = b.op("Sigmoid", [c4], {}, "sig")
    gap = b.op("GlobalAvgPool", [sig], {}, "gap")
    se = b.op("Sigmoid", [conv("se", gap, 12, 12, 1)], {}, "se_gate")
    scaled = b.op("Mul", [sig, se], {}, "scaled")
    out = b.op("GlobalAvgPool", [scaled], {}, "out")
    return b.finish([out, up])


def zoo_feed(batch: int = 2, size: int = 24, seed: int = 1) -> dict:
    return {"x": np.random.default_rng(seed).normal(size=(batch, 3, size, size)).astype(np.float32)}


def types_of(model) -> dict:
    """Tensor name -> (shape, numpy dtype) of every result of a module."""
    out = {}
    for op in model.ops:
        for r in op.results:
            if hasattr(r.type, "get_shape"):
                out[value_name(r)] = (tuple(r.type.get_shape()), A.numpy_dtype(A.dtype_name(r.type.element_type)))
    return out


def rows_shape(shape, rows) -> tuple:
    if rows is None:
        return tuple(shape)
    n0, n1, h0, h1 = rows
    return (n1 - n0, shape[1], h1 - h0, *shape[3:])


def local_bytes(types: dict, chip, name: str, rows, lane_axis: int = 1) -> int:
    """Bytes per lane a tensor's rows take in local memory (independently of the planner's sizes)."""
    shape, dtype = types[name]
    return lane_bytes(rows_shape(shape, rows), dtype.itemsize, chip, lane_axis)


def accesses(program, types: dict, i: int) -> tuple[list, list, list, list]:
    """(local reads, local writes, DDR reads, DDR writes) of command `i`, as (start, stop) byte
    ranges (local: per lane, the same in every lane; DDR: a tensor's whole extent)."""
    chip, cmd = program.chip, program.commands[i]
    lr, lw, dr, dw = [], [], [], []

    def ddr(addr, name):
        shape, dtype = types[name]
        return (addr, addr + numel(shape) * dtype.itemsize)

    if cmd["kind"] == "load":
        lw.append((cmd["local"], cmd["local"] + local_bytes(types, chip, cmd["tensor"], cmd["rows"],
                                                            cmd["lane_axis"])))
        dr.append(ddr(cmd["ddr"], cmd["tensor"]))
    elif cmd["kind"] == "store":
        lr.append((cmd["local"], cmd["local"] + local_bytes(types, chip, cmd["tensor"], cmd["rows"])))
        dw.append(ddr(cmd["ddr"], cmd["tensor"]))
    elif cmd["kind"] == "compute":
        for o in cmd["operands"]:
            if o is not None:
                lr.append((o["local"], o["local"] + local_bytes(types, chip, o["tensor"], o["rows"],
                                                                o.get("lane_axis", 1))))
        r = cmd["result"]
        lw.append((r["local"], r["local"] + local_bytes(types, chip, r["tensor"], r["rows"])))
    elif cmd["kind"] in ("global", "host"):
        op = program.model.ops[cmd["op"]]
        for v, addr in zip(op.operands, cmd["ins"]):
            if addr is not None:
                dr.append(ddr(addr, value_name(v)))
        for r, addr in zip(op.results, cmd["outs"]):
            dw.append(ddr(addr, value_name(r)))
    return lr, lw, dr, dw
