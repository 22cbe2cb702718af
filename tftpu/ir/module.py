"""TOP modules: build, print, parse, verify, save and load (`.top.mlir` text + weights `.npz`).

A `TopModel` pairs an xDSL `builtin.module` holding one `func.func @main` with the dict of
weight arrays its `top.Weight` ops name. The text is MLIR generic syntax with locations;
print -> parse -> print is byte-identical.

>>> b = TopBuilder("tiny")
>>> x = b.input("x", (1, 4))
>>> y = b.op("Relu", [x], {}, "y")
>>> model = b.finish([y])
>>> print(model.text().splitlines()[4].strip())
%2 = "top.Relu"(%1) : (tensor<1x4xf32>) -> tensor<1x4xf32> loc("y")
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import ModuleOp, NoneType, StringAttr
from xdsl.ir import Block, Region, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from tftpu.errors import ModelFileError, ShapeError
from tftpu.ir import attrs as A
from tftpu.ir import layout, quant, top, tpu, xdsl_lexer
from tftpu.ir.base import make_attributes, value_name
from tftpu.ir.weights import load_npz, save_npz
from tftpu.utils.files import check_writable, write_text
from tftpu.utils.names import unique_name

DIALECTS = (builtin.Builtin, func.Func, top.Top, layout.Layout, tpu.Tpu, quant.Quant)


def context() -> Context:
    """An xDSL context with every dialect tftpu reads loaded (builtin, func, top, tpu, quant, layout)."""
    xdsl_lexer.install()
    ctx = Context()
    for d in DIALECTS:
        ctx.load_dialect(d)
    return ctx


# xDSL's escapes of non-ASCII UTF-8 bytes (an escaped backslash is matched first, and kept)
_HIGH_BYTES = re.compile(r"\\\\|(?:\\[89A-F][0-9A-F])+")


def _utf8(match: re.Match) -> str:
    if match.group(0) == "\\\\":
        return match.group(0)
    raw = bytes(int(h, 16) for h in match.group(0).split("\\")[1:])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return match.group(0)


def print_module(module: ModuleOp) -> str:
    """MLIR generic text of `module`, with locations. Names in any script are written as UTF-8
    (MLIR reads them so; xDSL's byte escapes of them do not parse back)."""
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True, print_debuginfo=True).print_op(module)
    out.write("\n")
    return _HIGH_BYTES.sub(_utf8, out.getvalue())


_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')   # one complete MLIR string literal (linear time)


def _check_strings(text: str, source: str) -> None:
    """Refuse a string literal left open at the end of a line (MLIR strings never span lines):
    xDSL's lexer takes time exponential in the length of such a string (a truncated file)."""
    for number, line in enumerate(text.splitlines(), 1):
        if '"' in line:
            rest = _STRING.sub("", line).split("//", 1)[0]
            if '"' in rest:
                raise ModelFileError(source, f"not valid MLIR: line {number}: unterminated string "
                                             f"(is the file truncated?)")


def parse_module(text: str, source: str = "<string>") -> ModuleOp:
    """Parse MLIR text into a module; ModelFileError (naming `source`) if it is malformed."""
    _check_strings(text, source)
    try:
        module = Parser(context(), text, name=source).parse_module()
    except ParseError as e:
        first = str(e).strip().splitlines()
        # location, source line, caret, then the reason (which must not be lost)
        raise ModelFileError(source, f"not valid MLIR: {' '.join(part.strip() for part in first)}") from None
    except VerifyException as e:
        # the parser verifies attributes as it builds them (e.g. a value out of range for `i6`,
        # what a truncated `i64` becomes)
        raise ModelFileError(source, f"not valid MLIR: {' '.join(str(e).split())[:300]}") from None
    return module


def main_func(module: ModuleOp) -> func.FuncOp:
    """The `func.func` of a TOP module (the first one)."""
    for op in module.body.block.ops:
        if isinstance(op, func.FuncOp):
            return op
    raise ShapeError("module has no func.func")


@dataclass(repr=False)
class TopModel:
    """A TOP module and the weight arrays of its `top.Weight` ops (keyed by location)."""

    module: ModuleOp
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def __repr__(self) -> str:
        n = sum(1 for op in self.ops if not isinstance(op, (top.Weight, top.NoneOp)))
        return (f"TopModel({self.name!r}, {n} ops, {len(self.weights)} weights, "
                f"inputs={self.input_names}, outputs={self.output_names})")

    def __iter__(self):
        """`module, weights = model` unpacks like a pair."""
        return iter((self.module, self.weights))

    def copy(self):
        """A copy to rewrite: its own module (cloned, not printed and parsed again) and its own
        weight dict holding the same arrays."""
        return type(self)(self.module.clone(), dict(self.weights))

    @property
    def name(self) -> str:
        return self.module.attributes["module.name"].data

    @property
    def weight_file(self) -> str:
        return self.module.attributes["module.weight_file"].data

    @weight_file.setter
    def weight_file(self, value: str) -> None:
        self.module.attributes["module.weight_file"] = StringAttr(value)

    @property
    def func(self) -> func.FuncOp:
        return main_func(self.module)

    @property
    def ops(self) -> list:
        """Ops of the main function, in order, the return excluded."""
        return [op for op in self.func.body.block.ops if not isinstance(op, func.ReturnOp)]

    @property
    def return_op(self) -> func.ReturnOp:
        return self.func.body.block.last_op

    @property
    def input_names(self) -> list[str]:
        return [op.loc for op in self.ops if isinstance(op, top.Input)]

    @property
    def output_names(self) -> list[str]:
        return [value_name(v) for v in self.return_op.operands]

    def text(self) -> str:
        """The `.mlir` text."""
        return print_module(self.module)

    def verify(self) -> None:
        """Run every op's verifier and check weights against their `top.Weight` types."""
        for op in self.ops:
            try:
                op.verify()
            except VerifyException as e:
                msg = " ".join(str(e).split())[:500]
                if not msg.startswith(op.name):
                    msg = f"{op.name} at {top.loc_name(op)!r}: {msg}"
                raise ShapeError(f"{self.name}: {msg}") from None
        try:
            self.module.verify()
        except VerifyException as e:
            raise ShapeError(f"{self.name}: {' '.join(str(e).split())[:500]}") from None
        for op in self.ops:
            if isinstance(op, top.Weight):
                arr = self.weights.get(op.key)
                if arr is None:
                    raise ShapeError(f"{self.name}: weight {op.key!r} is missing from the weight file")
                t = op.output.type
                if tuple(arr.shape) != A.shape_of(t) or A.dtype_of_numpy(arr.dtype) != A.dtype_name(t.element_type):
                    raise ShapeError(f"{self.name}: weight {op.key!r} is {arr.dtype}{list(arr.shape)}, "
                                     f"the op says {t}")

    def used_weights(self) -> dict[str, np.ndarray]:
        """Only the weights some `top.Weight` op still names, in sorted key order."""
        names = sorted({op.key for op in self.ops if isinstance(op, top.Weight)})
        return {n: self.weights[n] for n in names}

    def save(self, mlir_path, weight_path=None) -> tuple[Path, Path]:
        """Write the `.mlir` and its weights `.npz` (beside it unless `weight_path`), atomically."""
        mlir_path = Path(mlir_path)
        if weight_path is None:
            weight_path = mlir_path.parent / self.default_weight_name()
        weight_path = Path(weight_path)
        check_writable(mlir_path, weight_path)      # both checked before either is written
        # the .mlir names its weights relative to itself, so the pair moves together
        self.weight_file = os.path.relpath(weight_path.resolve(), mlir_path.resolve().parent)
        save_npz(weight_path, self.used_weights())
        write_text(mlir_path, self.file_text())
        return mlir_path, weight_path

    def file_text(self) -> str:
        """The text a file holds: `text()` (TPU modules put layer groups in `tpu.Group` regions)."""
        return self.text()

    def default_weight_name(self) -> str:
        """The weight file's name when `save` is not given one."""
        return default_weight_file(self.name)

    def flops(self) -> int:
        """Total FLOPs of the module."""
        return sum(op.flops() for op in self.ops if not isinstance(op, (top.Weight, top.NoneOp, top.Input)))


class TpuModel(TopModel):
    """A TPU module (lowered for one chip and mode) and its weights (INT8, INT32, float)."""

    def __repr__(self) -> str:
        return f"TpuModel({self.name!r}, chip={self.chip!r}, mode={self.mode!r}, {len(self.ops)} ops)"

    def file_text(self) -> str:
        """The text with each layer group (ops carrying `group_info`) in a `tpu.Group` region, as
        TPU-MLIR prints them; `load` flattens it again."""
        if not any("group_info" in op.attributes for op in self.ops):
            return self.text()
        from tftpu.ir.group import wrap
        copy = self.copy()
        wrap(copy.func.body.block)
        return copy.text()

    @property
    def chip(self) -> str:
        return self.module.attributes["module.chip"].data

    @property
    def mode(self) -> str:
        return self.module.attributes["module.mode"].data

    @property
    def asymmetric(self) -> bool:
        attr = self.module.attributes.get("module.asymmetric")
        return bool(attr is not None and attr.value.data)

    def default_weight_name(self) -> str:
        return default_weight_file(self.name, f"tpu_{self.mode.lower()}")

    def flops(self) -> int:
        return sum(op.flops() for op in self.ops if isinstance(op, tpu.TpuOp))


def default_weight_file(name: str, stage: str = "top_f32") -> str:
    """Weight file name for a model name, as TPU-MLIR: `NAME_top_f32_weights.npz` (path
    separators and control characters in the name become `_`; a long name is shortened)."""
    safe = re.sub(r"[\x00-\x1f/\\]", "_", name).lstrip(".") or "model"
    if len(safe.encode()) > 120:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        safe = safe.encode()[:100].decode("utf-8", "ignore") + "_" + digest
    return f"{safe}_{stage}_weights.npz"


def _flatten(module) -> None:
    """Layer groups (`tpu.Group` regions) back into the flat op list every tool walks."""
    from tftpu.ir.group import GroupOp, unwrap
    if any(isinstance(op, GroupOp) for op in module.walk()):
        unwrap(module)


def load(mlir_path, weights: dict | None = None) -> TopModel:
    """Read a `.top.mlir` and its weight file (`module.weight_file`, relative to the .mlir)."""
    mlir_path = Path(mlir_path)
    if not mlir_path.is_file():
        raise ModelFileError(mlir_path, "no such file")
    try:
        text = mlir_path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelFileError(mlir_path, "not a text .mlir file") from None
    module = parse_module(text, str(mlir_path))
    _flatten(module)
    for key in ("module.name", "module.weight_file"):
        if not isinstance(module.attributes.get(key), StringAttr):
            raise ModelFileError(mlir_path, f"module has no {key} attribute")
    state = module.attributes.get("module.state")
    model = (TpuModel if isinstance(state, StringAttr) and state.data.startswith("TPU") else TopModel)(module)
    if isinstance(model, TpuModel):
        for key in ("module.chip", "module.mode"):
            if not isinstance(module.attributes.get(key), StringAttr):
                raise ModelFileError(mlir_path, f"TPU module has no {key} attribute")
    try:
        if weights is None:
            wf = Path(model.weight_file)
            wf = wf if wf.is_absolute() else mlir_path.parent / wf
            has_weights = any(isinstance(op, top.Weight) for op in model.ops)
            weights = load_npz(wf) if has_weights or wf.exists() else {}
        model.weights = dict(weights)
        model.verify()
    except (KeyError, ValueError, TypeError, IndexError, AttributeError, VerifyException) as e:
        # a file that parses but is not a well-formed module (an op's property renamed, a
        # region missing): xDSL's verifiers assume what its own printer writes
        raise ModelFileError(mlir_path, f"not a valid tftpu module: {type(e).__name__}: "
                                        f"{' '.join(str(e).split())[:200]}") from None
    return model


class TopBuilder:
    """Builds a TOP module op by op: inputs, weights, ops, then `finish(outputs)`."""

    def __init__(self, name: str, weight_file: str | None = None):
        self.name = name
        self.weight_file = weight_file or default_weight_file(name)
        self.block = Block()
        self.weights: dict[str, np.ndarray] = {}
        self._weight_values: dict[str, SSAValue] = {}
        self._none: SSAValue | None = None
        self._input_types: list = []

    def input(self, name: str, shape, dtype: str = "f32") -> SSAValue:
        """A model input named `name`."""
        t = A.tensor_type(shape, dtype)
        arg = self.block.insert_arg(t, len(self.block.args))
        self._input_types.append(t)
        op = top.Input.create(operands=[arg], result_types=[t])
        top.set_loc(op, name)
        self.block.add_op(op)
        return op.results[0]

    def weight(self, name: str, array: np.ndarray, key: str | None = None) -> SSAValue:
        """A `top.Weight` for `array` named `name` (reused when the same name comes again),
        stored in the weight file under `key` (default: its name; made unique)."""
        if name in self._weight_values:
            return self._weight_values[name]
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if key is None:
            name = key = self.unique_weight_name(name)
        else:
            key = self.unique_weight_name(key)
        self.weights[key] = array
        op = top.Weight.create(result_types=[A.tensor_type(array.shape, A.dtype_of_numpy(array.dtype))],
                               attributes={} if key == name else {"key": top.Weight.ATTRS["key"].encode(key)})
        top.set_loc(op, name)
        self.block.add_op(op)
        self._weight_values[name] = op.results[0]
        return op.results[0]

    def unique_weight_name(self, name: str) -> str:
        """`name`, or `name_<i>` with the smallest i >= 1 that no weight has yet."""
        return unique_name(name, self.weights)

    def none(self) -> SSAValue:
        """The shared `top.None` value."""
        if self._none is None:
            op = top.NoneOp.create(result_types=[NoneType()])
            self.block.add_op(op)
            self._none = op.results[0]
        return self._none

    def op(self, op_name: str, operands: list, attrs: dict, loc, result_types=None):
        """Append `top.<op_name>`; result types are inferred unless given. Returns the result(s)."""
        op = make_op(op_name, operands, attrs, loc, result_types)
        self.block.add_op(op)
        return op.results[0] if len(op.results) == 1 else list(op.results)

    def finish(self, outputs: list[SSAValue]) -> TopModel:
        """Close the function with `return outputs` and wrap it in a module."""
        self.block.add_op(func.ReturnOp(*outputs))
        fn = func.FuncOp("main", (self._input_types, [o.type for o in outputs]), Region(self.block))
        module = ModuleOp([fn], attributes={"module.name": StringAttr(self.name),
                                            "module.weight_file": StringAttr(self.weight_file),
                                            "module.state": StringAttr("TOP_F32")})
        return TopModel(module, self.weights)


def op_class(op_name: str):
    """The op class of a full name (`top.Conv`, `tpu.Conv`); a bare name (`Conv`) means the TOP op."""
    full = op_name if "." in op_name else f"top.{op_name}"
    cls = top.OPS_BY_NAME.get(full) or tpu.OPS_BY_NAME.get(full)
    if cls is None:
        raise ValueError(f"no op named {full}")
    return cls


def make_op(op_name: str, operands: list, attrs: dict, loc, result_types=None):
    """Create (not insert) the op `op_name` (`top.Conv`, or `Conv` for the TOP op) with
    plain-Python `attrs`, stored in declaration order; result types inferred unless given."""
    cls = op_class(op_name)
    attributes = make_attributes(cls, attrs)
    if result_types is None:
        probe = cls.create(operands=list(operands), attributes=attributes)
        try:
            full = probe.attrs()
            shapes = probe.operand_shapes()
            probe.check(shapes, full)
            dtypes = [None if s is None else A.dtype_name(v.type.element_type) for v, s in zip(operands, shapes)]
            result_types = [A.tensor_type(s, d)
                            for s, d in zip(cls.infer(shapes, full), cls.infer_dtypes(dtypes, full))]
        except (ValueError, IndexError, TypeError, ZeroDivisionError, VerifyException) as e:
            raise ShapeError(f"{cls.name} at {loc!r}: {e}") from None
        finally:
            probe.drop_all_references()
    op = cls.create(operands=list(operands), result_types=list(result_types), attributes=attributes)
    top.set_loc(op, loc)
    return op
