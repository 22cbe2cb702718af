"""The simulated chip: executes a program's command list on a byte-addressed DDR and a local
memory of `lanes` x `local_mem_per_lane` bytes, with the TPU kernels on whole slices.

Local memory holds tensors the chip's way: the lane axis (channels; a weight's first axis)
spread over the lanes, channel c in lane c % lanes, every (outer, slot) plane padded to the EU
width. A command whose local offset is not EU-aligned or whose data would pass the end of a
lane, or a DDR access outside DDR, is a `SimulatorError` naming the command. INT8, BF16 and F16
results equal TPU-dialect inference bit for bit: a slice runs the same integer kernel on the same
values, and a float window op makes each output row by the same call as TPU inference does
(`tftpu.interp.tpu.float_rows`). In F32 modules TPU inference runs TOP's kernels on whole
tensors, whose float32 sums a slice may order differently: there they agree to round-off.

>>> outputs = Simulator(program).run({"input": x})       # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from tftpu.errors import InternalError
from tftpu.interp.tpu.info import info_of
from tftpu.interp.tpu.interpreter import kernel_of
from tftpu.ir import attrs as A
from tftpu.ir.base import value_name
from tftpu.utils.inputs import match_inputs, numeric

__all__ = ["Simulator", "SimulatorError", "simulate"]


class SimulatorError(InternalError):
    """A command broke the chip's rules (alignment, bounds): a codegen bug or a corrupt program."""

    def __init__(self, index: int, cmd: dict, message: str):
        what = f"command {index} ({cmd.get('kind')} {cmd.get('name') or cmd.get('tensor', '')})"
        super().__init__("simulator", f"{what}: {message}")


def _align(n: int, a: int) -> int:
    return -(-n // a) * a if a > 1 else n


class Simulator:
    """Runs one program many times (its weights are written into DDR once per run)."""

    def __init__(self, program):
        self.program = program
        chip = program.chip
        self.lanes, self.bank, self.eu = chip.lanes, chip.local_mem_per_lane, chip.eu_bytes
        self.types: dict = {}
        self.infos: dict = {}
        self.ops = list(program.model.ops)
        for op in self.ops:
            for r in op.results:
                t = r.type
                if hasattr(t, "get_shape"):
                    self.types[value_name(r)] = (tuple(t.get_shape()), A.numpy_dtype(A.dtype_name(t.element_type)))
                    info = info_of(t)
                    if info is not None and info.quantized:
                        self.infos[value_name(r)] = info
        self.kernels: dict = {}
        self.attrs: dict = {}
        self.weights = np.frombuffer(program.weight_blob(), np.uint8)

    # -- memories

    def _ddr_view(self, ddr, addr: int, shape, dtype, i, cmd) -> np.ndarray:
        n = int(np.prod(shape)) * dtype.itemsize
        if addr < 0 or addr + n > ddr.size:
            raise SimulatorError(i, cmd, f"DDR bytes {addr}..{addr + n} outside DDR of {ddr.size} B")
        return ddr[addr:addr + n].view(dtype).reshape(shape)

    def _layout(self, shape, lane_axis: int, itemsize: int) -> tuple[int, int, int, int]:
        outer = int(np.prod(shape[:lane_axis]))
        c = shape[lane_axis] if len(shape) > lane_axis else 1
        inner = int(np.prod(shape[lane_axis + 1:]))
        return outer, c, inner, _align(inner * itemsize, self.eu)

    def _check_local(self, offset: int, nbytes: int, i, cmd) -> None:
        if offset % self.eu:
            raise SimulatorError(i, cmd, f"local offset {offset} is not aligned to the {self.eu}-byte EU width")
        if offset < 0 or offset + nbytes > self.bank:
            raise SimulatorError(i, cmd, f"local bytes {offset}..{offset + nbytes} pass the end of a lane "
                                         f"({self.bank} B)")

    def _write_local(self, local, offset: int, arr: np.ndarray, lane_axis: int, i, cmd) -> None:
        outer, c, inner, plane = self._layout(arr.shape, lane_axis, arr.itemsize)
        slots = -(-c // self.lanes)
        nbytes = outer * slots * plane
        self._check_local(offset, nbytes, i, cmd)
        a = np.ascontiguousarray(arr).reshape(outer, c, inner)
        if slots * self.lanes != c:
            a = np.concatenate([a, np.zeros((outer, slots * self.lanes - c, inner), a.dtype)], axis=1)
        raw = a.reshape(outer, slots, self.lanes, inner).transpose(2, 0, 1, 3).view(np.uint8)
        raw = raw.reshape(self.lanes, outer * slots, inner * arr.itemsize)
        view = local[:, offset:offset + nbytes].reshape(self.lanes, outer * slots, plane)
        view[:, :, :inner * arr.itemsize] = raw

    def _read_local(self, local, offset: int, shape, dtype, lane_axis: int, i, cmd) -> np.ndarray:
        outer, c, inner, plane = self._layout(shape, lane_axis, dtype.itemsize)
        slots = -(-c // self.lanes)
        nbytes = outer * slots * plane
        self._check_local(offset, nbytes, i, cmd)
        view = local[:, offset:offset + nbytes].reshape(self.lanes, outer * slots, plane)
        raw = np.ascontiguousarray(view[:, :, :inner * dtype.itemsize]).view(dtype)
        a = raw.reshape(self.lanes, outer, slots, inner).transpose(1, 2, 0, 3).reshape(outer, slots * self.lanes, inner)
        return np.ascontiguousarray(a[:, :c]).reshape(shape)

    # -- commands

    def _kernel(self, index: int):
        if index not in self.kernels:
            op = self.ops[index]
            self.kernels[index] = (kernel_of(op), op.attrs(), op)
        return self.kernels[index]

    def _attrs(self, index: int, pads) -> dict:
        kernel, attrs, op = self._kernel(index)
        if pads is None:
            return attrs
        key = (index, tuple(pads))
        if key not in self.attrs:
            patched = dict(attrs)
            p = list(attrs["pads"])
            half = len(p) // 2
            p[0], p[half] = pads
            patched["pads"] = p
            patched["ceil_mode"] = False
            self.attrs[key] = patched
        return self.attrs[key]

    def _slice_shape(self, name: str, rows) -> tuple:
        shape = self.types[name][0]
        if rows is None:
            return shape
        n0, n1, h0, h1 = rows
        return (n1 - n0, shape[1], h1 - h0, *shape[3:])

    def run(self, inputs: dict, dump_all: bool = False, dequantize: bool = False) -> dict:
        """Outputs by name, as the program's output descriptions give them; `dump_all` adds
        every tensor that reaches DDR (those inside a layer group never do); `dequantize` turns
        INT8 tensors into the float values they stand for."""
        p = self.program
        ddr = np.zeros(p.ddr_bytes, np.uint8)
        ddr[:self.weights.size] = self.weights
        local = np.zeros((self.lanes, self.bank), np.uint8)
        dump: dict = {}
        arrays = match_inputs([d["name"] for d in p.inputs], inputs)
        for d, arr in zip(p.inputs, arrays):
            shape, dtype = tuple(d["shape"]), A.numpy_dtype(d["dtype"])
            arr = numeric(d["name"], arr)
            if tuple(arr.shape) != shape:
                from tftpu.errors import ShapeError
                raise ShapeError(f"input {d['name']!r} has shape {list(arr.shape)}, the model wants {list(shape)}")
            self._ddr_view(ddr, d["ddr"], shape, dtype, -1, {"kind": "input", "name": d["name"]})[...] = arr
        for i, cmd in enumerate(p.commands):
            kind = cmd["kind"]
            if kind == "load":
                name = cmd["tensor"]
                shape, dtype = self.types[name]
                full = self._ddr_view(ddr, cmd["ddr"], shape, dtype, i, cmd)
                r = cmd["rows"]
                data = full if r is None else full[r[0]:r[1], :, r[2]:r[3]]
                self._write_local(local, cmd["local"], data, cmd["lane_axis"], i, cmd)
            elif kind == "store":
                name = cmd["tensor"]
                shape, dtype = self.types[name]
                r = cmd["rows"]
                data = self._read_local(local, cmd["local"], self._slice_shape(name, r), dtype, 1, i, cmd)
                full = self._ddr_view(ddr, cmd["ddr"], shape, dtype, i, cmd)
                full[r[0]:r[1], :, r[2]:r[3]] = data
                if dump_all:
                    dump[name] = full.copy()
            elif kind == "compute":
                self._compute(local, i, cmd)
            elif kind in ("global", "host"):
                made = self._global(ddr, i, cmd)
                if dump_all:
                    dump.update(made)
            else:
                raise SimulatorError(i, cmd, f"unknown command kind {kind!r}")
        out = dump
        for d in p.outputs:
            shape, dtype = tuple(d["shape"]), A.numpy_dtype(d["dtype"])
            out[d["name"]] = self._ddr_view(ddr, d["ddr"], shape, dtype, -1, {"kind": "output"}).copy()
        if dequantize:
            out = {k: self.infos[k].dequantize(v) if k in self.infos else v for k, v in out.items()}
        return out

    def _compute(self, local, i: int, cmd: dict) -> None:
        kernel, _, op = self._kernel(cmd["op"])
        operands = []
        for o in cmd["operands"]:
            if o is None:
                operands.append(None)
                continue
            name = o["tensor"]
            dtype = self.types[name][1]
            if o["rows"] is None:
                operands.append(self._read_local(local, o["local"], self.types[name][0], dtype,
                                                 o.get("lane_axis", 0), i, cmd))
                continue
            held = o["rows"]
            arr = self._read_local(local, o["local"], self._slice_shape(name, held), dtype, 1, i, cmd)
            u = o["use"]
            arr = arr[u[0] - held[0]:u[1] - held[0], :, u[2] - held[2]:u[3] - held[2]]
            operands.append(arr)
        results = kernel(operands, self._attrs(cmd["op"], cmd.get("pads")))
        res = cmd["result"]
        want = self._slice_shape(res["tensor"], res["rows"])
        got = np.asarray(results[0])
        if tuple(got.shape) != want:
            raise SimulatorError(i, cmd, f"the kernel made {list(got.shape)}, the slice is {list(want)}")
        self._write_local(local, res["local"], got.astype(self.types[res["tensor"]][1], copy=False), 1, i, cmd)

    def _global(self, ddr, i: int, cmd: dict) -> None:
        kernel, attrs, op = self._kernel(cmd["op"])
        operands = []
        for v, addr in zip(op.operands, cmd["ins"]):
            if addr is None:
                operands.append(None)
                continue
            shape, dtype = self.types[value_name(v)]
            operands.append(self._ddr_view(ddr, addr, shape, dtype, i, cmd).copy())
        results = kernel(operands, attrs)
        made = {}
        for r, addr, got in zip(op.results, cmd["outs"], results):
            shape, dtype = self.types[value_name(r)]
            view = self._ddr_view(ddr, addr, shape, dtype, i, cmd)
            view[...] = np.asarray(got).astype(dtype, copy=False)
            made[value_name(r)] = view.copy()
        return made


def simulate(program, inputs: dict) -> dict:
    """Run `program` once on `inputs` (name -> array)."""
    return Simulator(program).run(inputs)
