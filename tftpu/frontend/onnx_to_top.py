"""ONNX -> TOP: one converter per ONNX op type, on a static, constant-folded graph.

Each TOP op is named (by location) after its ONNX node's first output tensor, so TOP tensors
can be compared with onnxruntime's by name. Every unsupported op is collected and reported at
once as an `UnsupportedOpError` (op type and node name).

>>> model = onnx_to_top("resnet.onnx", input_shapes=[[1, 3, 224, 224]])  # doctest: +SKIP
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tftpu import geometry
from tftpu.errors import InternalError, ModelFileError, ShapeError, TftpuError, UnsupportedOpError
from tftpu.frontend.onnx_load import Prepared, node_ident, prepare
from tftpu.frontend.onnx_registry import CONVERTERS, Unsupported, converter
from tftpu.ir import attrs as A
from tftpu.ir.module import TopBuilder, TopModel

F32_MAX = float(np.finfo(np.float32).max)
_GENERATED = re.compile(r"__\d+(:\d+)?$")




def _onnx_dtype(np_dtype) -> str:
    try:
        return A.dtype_of_numpy(np_dtype)
    except ShapeError:
        raise Unsupported(f"dtype {np.dtype(np_dtype)}") from None


class Importer:
    """Walks a prepared ONNX graph and emits TOP ops through a `TopBuilder`."""

    def __init__(self, prep: Prepared, name: str):
        self.p = prep
        self.b = TopBuilder(name)
        self.values: dict[str, object] = {}
        self.failed: set[str] = set()
        self.current = None

    # ------------------------------------------------------------ helpers for converters
    def shape(self, name: str) -> tuple:
        s = self.p.shapes.get(name)
        if s is None:
            raise Unsupported(f"tensor {name!r} has no static shape")
        return s

    def const(self, name: str):
        """The constant array of an input, or None when it is a runtime value or absent."""
        if not name:
            return None
        return self.p.consts.get(name)

    def scalar(self, name: str, what: str) -> float:
        """The one value of a constant input ONNX requires to be a scalar (ShapeError otherwise)."""
        v = self.need_const(name, what)
        if v.size != 1:
            raise ShapeError(f"{what} {name!r} must be a scalar, it has shape {list(v.shape)}")
        return float(v.reshape(()))

    def ints(self, name: str, what: str) -> list[int]:
        """A constant input ONNX requires to be a 1-D list of integers (ShapeError otherwise)."""
        v = self.need_const(name, what)
        if v.ndim > 1 or v.dtype.kind not in "iu":
            raise ShapeError(f"{what} {name!r} must be a 1-D integer tensor, it is {v.dtype} of shape {list(v.shape)}")
        return [int(x) for x in v.reshape(-1)]

    def need_const(self, name: str, what: str) -> np.ndarray:
        v = self.const(name)
        if v is None:
            raise Unsupported(f"{what} must be a constant")
        return v

    def value(self, name: str):
        """SSA value of an ONNX tensor (constants become `top.Weight` named by the tensor)."""
        if not name:
            return self.b.none()
        if name in self.values:
            return self.values[name]
        if name in self.p.consts:
            arr = self.p.consts[name]
            if arr.dtype == np.float64:
                arr = arr.astype(np.float32)
            _onnx_dtype(arr.dtype)
            v = self.b.weight(self._weight_name(name), arr)
            self.values[name] = v
            return v
        raise KeyError(name)

    def _weight_name(self, name: str) -> str:
        """Initializer names tf2onnx generates (`const_fold_opt__123`) change from run to run;
        name those after their consumer instead, so the output is byte-identical."""
        node = self.current
        if node is None or not _GENERATED.search(name):
            return name
        idx = list(node.input).index(name) if name in node.input else 0
        return f"{node.output[0]}_in{idx}"

    def weight(self, name: str, arr: np.ndarray):
        return self.b.weight(name, np.asarray(arr, order="C"))

    def emit(self, node, op_name: str, operands: list, attrs: dict, out: int = 0, loc=None):
        """Append a TOP op for `node` and bind its result to the node's output `out`."""
        loc = loc if loc is not None else node.output[out]
        res = self.b.op(op_name, operands, attrs, loc)
        results = res if isinstance(res, list) else [res]
        names = [loc] if isinstance(loc, str) else list(loc)
        for n, r in zip(names, results):
            want = self.p.shapes.get(n)
            got = A.shape_of(r.type)
            if want is not None and tuple(want) != got:
                raise ShapeError(f"TOP infers {list(got)} for {n!r}, ONNX says {list(want)}")
            self.values[n] = r
        return res

    def alias(self, node, value) -> None:
        self.values[node.output[0]] = value

    # ------------------------------------------------------------ driver
    def run(self) -> TopModel:
        for name in self.p.inputs:
            s = self.p.shapes.get(name)
            if s is None:
                raise ShapeError(f"input {name!r} has no static shape; pass --input_shapes")
            dtype = self.p.dtypes.get(name, np.float32)
            try:
                self.values[name] = self.b.input(name, s, _onnx_dtype(dtype))
            except Unsupported:
                raise ModelFileError(self.p.where, f"input {name!r} has element type {np.dtype(dtype)}, "
                                                   f"which tftpu does not import") from None
        bad = []
        for node in self.p.nodes:
            ident = node_ident(node)
            fn = CONVERTERS.get(f"onnx.{node.op_type}") if node.domain in ("", "ai.onnx") else None
            if fn is None:
                bad.append((f"{node.domain + '.' if node.domain else ''}{node.op_type}", ident))
                self.failed.update(node.output)
                continue
            if any(i in self.failed for i in node.input):
                self.failed.update(node.output)
                continue
            self.current = node
            try:
                fn(self, node, _attrs(node, self.p.where))
            except Unsupported as e:
                bad.append((node.op_type, f"{ident}: {e}"))
                self.failed.update(node.output)
            except ShapeError as e:  # TOP's own checks refuse what the node's attributes ask
                raise ModelFileError(self.p.where, f"{node.op_type} {ident!r}: {e}") from None
            except TftpuError:
                raise
            except Exception as e:  # the node passed ONNX's own checks (onnx_load.NodeCheck): a bug here
                raise InternalError(f"ONNX {node.op_type} {ident!r}",
                                    f"converter failed: {type(e).__name__}: {e}") from e
        if bad:
            raise UnsupportedOpError(bad, self.p.where)
        self.current = None
        outs = []
        for name in self.p.outputs:
            outs.append(self._named_output(name))
        model = self.b.finish(outs)
        return model


    def _named_output(self, name: str):
        """The value of graph output `name`, its producer renamed `name` (or an identity Reshape
        named `name` when the value is an input, a weight or already another output)."""
        from tftpu.ir.top import set_loc
        v = self.value(name)
        owner = v.owner
        if owner.loc == name:
            return v
        renamable = owner.name not in ("top.Input", "top.Weight") and len(owner.results) == 1 \
            and owner.loc not in self.p.outputs
        if renamable:
            set_loc(owner, name)
            return v
        return self.b.op("Reshape", [v], {"shape": list(A.shape_of(v.type))}, name)


class _NodeAttrs(dict):
    """A node's attributes; a required one that is absent is a malformed model, named as such."""

    def __init__(self, node, values: dict, where: str):
        super().__init__(values)
        self.node = node
        self.where = where

    def __missing__(self, key):
        raise ModelFileError(self.where, f"{self.node.op_type} {node_ident(self.node)!r}: required attribute "
                                         f"{key!r} is missing")


def _attrs(node, where: str = "<onnx>") -> dict:
    from onnx import helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        try:
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list):
                v = [x.decode() if isinstance(x, bytes) else x for x in v]
        except UnicodeDecodeError:
            raise ModelFileError(where, f"{node.op_type} {node_ident(node)!r}: attribute {a.name!r} is not UTF-8 "
                                        f"text") from None
        out[a.name] = v
    return _NodeAttrs(node, out, where)


def onnx_to_top(model, name: str | None = None, input_shapes=None, where: str | None = None) -> TopModel:
    """Import an ONNX model (path, bytes or ModelProto) into a verified TOP model. Errors name
    `where` (by default the path given, else the graph's name)."""
    prep = prepare(model, input_shapes, where)
    if name is None:
        name = Path(model).stem if isinstance(model, (str, Path)) else (prep.model.graph.name or "model")
    top_model = Importer(prep, name).run()
    top_model.verify()
    return top_model


# ================================================================ converters

def _same_pads(in_sp, k, s, d, mode: str) -> list[int]:
    pairs = [geometry.same_pads(size, k[i], s[i], d[i], lower=mode == "SAME_LOWER") for i, size in enumerate(in_sp)]
    return [b for b, _ in pairs] + [e for _, e in pairs]


def _window(imp: Importer, node, a: dict, k: list[int]) -> dict:
    n = len(k)
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(imp.shape(node.input[0])[2:], k, strides, dil, auto)
    elif auto == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(a.get("pads", [0] * (2 * n)))
    return {"kernel_shape": list(k), "strides": strides, "pads": pads, "dilations": dil}


@converter("Conv")
def _conv(imp, node, a):
    w = imp.shape(node.input[1])
    k = list(a.get("kernel_shape", w[2:]))
    attrs = _window(imp, node, a, k)
    attrs.update(group=a.get("group", 1), do_relu=False, relu_limit=-1.0)
    bias = node.input[2] if len(node.input) > 2 else ""
    imp.emit(node, "Conv", [imp.value(node.input[0]), imp.value(node.input[1]), imp.value(bias)], attrs)


@converter("LRN")
def _lrn(imp, node, a):
    """Local response normalization (AlexNet, GoogLeNet) in ops TOP has: x * d^-beta with
    d = bias + alpha / size * (the sum of x^2 over `size` neighbouring channels), the channel sum
    a 1x1 conv with a banded filter and d^-beta as exp(-beta log d)."""
    shape = imp.shape(node.input[0])
    if len(shape) != 4:
        raise Unsupported(f"{len(shape)}-D input (LRN imports on NCHW)")
    size = int(a["size"])
    alpha, beta, bias = float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)), float(a.get("bias", 1.0))
    if size < 1 or bias <= 0 or alpha < 0:
        raise Unsupported(f"size {size}, alpha {alpha}, bias {bias} (LRN needs size >= 1, alpha >= 0, bias > 0)")
    c = shape[1]
    i = np.arange(c)
    band = (i[None, :] >= i[:, None] - (size - 1) // 2) & (i[None, :] <= i[:, None] + size // 2)
    out, x = node.output[0], imp.value(node.input[0])
    sq = imp.b.op("Mul", [x, x], {}, f"{out}_square")
    conv = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0] * 4, "dilations": [1, 1], "group": 1,
            "do_relu": False, "relu_limit": -1.0}
    d = imp.b.op("Conv", [sq, imp.weight(f"{out}_band", (band * (alpha / size)).astype(np.float32)[:, :, None, None]),
                          imp.weight(f"{out}_bias", np.full(c, bias, np.float32))], conv, f"{out}_denominator")
    log = imp.b.op("Log", [d], {}, f"{out}_log")
    scaled = imp.b.op("Mul", [log, imp.weight(f"{out}_beta", np.array(-beta, np.float32))], {}, f"{out}_log_scaled")
    imp.emit(node, "Mul", [x, imp.b.op("Exp", [scaled], {}, f"{out}_factor")], {})


@converter("ConvTranspose")
def _deconv(imp, node, a):
    x, w = imp.shape(node.input[0]), imp.shape(node.input[1])
    n = len(x) - 2
    k = list(a.get("kernel_shape", w[2:]))
    s = list(a.get("strides", [1] * n))
    d = list(a.get("dilations", [1] * n))
    op = list(a.get("output_padding", [0] * n))
    auto = a.get("auto_pad", "NOTSET")
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        out = list(a["output_shape"])[-n:] if "output_shape" in a else [x[2 + i] * s[i] for i in range(n)]
        try:
            pairs = [geometry.deconv_pads(x[2 + i], out[i], k[i], s[i], d[i], op[i], upper=auto == "SAME_UPPER")
                     for i in range(n)]
        except ShapeError:
            raise Unsupported(f"output_shape {out} needs negative pads") from None
        pads = [b for b, _ in pairs] + [e for _, e in pairs]
    elif auto == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(a.get("pads", [0] * (2 * n)))
    attrs = {"kernel_shape": k, "strides": s, "pads": pads, "dilations": d, "group": a.get("group", 1),
             "output_padding": op, "do_relu": False, "relu_limit": -1.0}
    bias = node.input[2] if len(node.input) > 2 else ""
    imp.emit(node, "Deconv", [imp.value(node.input[0]), imp.value(node.input[1]), imp.value(bias)], attrs)


@converter("Gemm")
def _gemm(imp, node, a):
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    trans_a, trans_b = a.get("transA", 0), a.get("transB", 0)
    x = imp.value(node.input[0])
    if trans_a:
        x = imp.b.op("Permute", [x], {"order": [1, 0]}, f"{node.output[0]}_transA")
    bconst = imp.const(node.input[1])
    if bconst is not None:
        b = imp.value(node.input[1]) if alpha == 1.0 else \
            imp.weight(f"{node.input[1]}_alpha", (bconst * np.float32(alpha)).astype(np.float32))
    elif alpha == 1.0:
        b = imp.value(node.input[1])
    else:
        raise Unsupported("alpha != 1 with a non-constant B")
    n_out = imp.shape(node.output[0])[-1]
    bias = imp.b.none()
    c_name = node.input[2] if len(node.input) > 2 else ""
    add_c = None
    if c_name and beta != 0.0:
        c = imp.const(c_name)
        if c is not None:
            c = (c.astype(np.float32) * np.float32(beta)).astype(np.float32)
            if c.size == n_out and c.ndim <= 2:
                c = c.reshape(n_out)
            bias = imp.weight(c_name if beta == 1.0 else f"{c_name}_beta", c)
        elif beta == 1.0:
            add_c = imp.value(c_name)
        else:
            raise Unsupported("beta != 1 with a non-constant C")
    if add_c is None:
        imp.emit(node, "MatMul", [x, b, bias], {"right_transpose": bool(trans_b), "do_relu": False,
                                                "relu_limit": -1.0})
    else:
        mm = imp.b.op("MatMul", [x, b, bias], {"right_transpose": bool(trans_b)}, f"{node.output[0]}_matmul")
        imp.emit(node, "Add", [mm, add_c], {})


@converter("MatMul")
def _matmul(imp, node, a):
    sa, sb = imp.shape(node.input[0]), imp.shape(node.input[1])
    if len(sa) < 2 or len(sb) < 2:
        raise Unsupported("1-D matmul operands")
    imp.emit(node, "MatMul", [imp.value(node.input[0]), imp.value(node.input[1]), imp.b.none()],
             {"right_transpose": False, "do_relu": False, "relu_limit": -1.0})


_BINARY = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "Max": "Max", "Min": "Min", "Sum": "Add"}


@converter(*_BINARY)
def _binary(imp, node, a):
    ins = [i for i in node.input]
    if len(ins) == 1:
        imp.alias(node, imp.value(ins[0]))
        return
    if len(ins) != 2:
        raise Unsupported(f"{len(ins)} operands")
    if imp.p.dtypes.get(node.output[0], np.float32) != np.float32:
        raise Unsupported("non-float32 arithmetic")
    imp.emit(node, _BINARY[node.op_type], [imp.value(ins[0]), imp.value(ins[1])], {})


@converter("Pow")
def _pow(imp, node, a):
    e = imp.need_const(node.input[1], "exponent")
    if e.size != 1:
        raise Unsupported("non-scalar exponent")
    e = float(e.reshape(()))
    x = imp.value(node.input[0])
    if e == 1.0:
        imp.alias(node, x)
    elif e == 2.0:
        imp.emit(node, "Mul", [x, x], {})
    elif e in (3.0, 4.0):  # tanh-approximated GELU has x ** 3
        sq = imp.b.op("Mul", [x, x], {}, f"{node.output[0]}_sq")
        imp.emit(node, "Mul", [sq, x if e == 3.0 else sq], {})
    elif e == 0.5:
        imp.emit(node, "Sqrt", [x], {})
    elif e in (-1.0, -0.5):
        one = imp.weight(f"{node.output[0]}_one", np.array(1.0, np.float32))
        den = x if e == -1.0 else imp.b.op("Sqrt", [x], {}, f"{node.output[0]}_sqrt")
        imp.emit(node, "Div", [one, den], {})
    else:
        raise Unsupported(f"exponent {e}")


@converter("Reciprocal")
def _reciprocal(imp, node, a):
    one = imp.weight(f"{node.output[0]}_one", np.array(1.0, np.float32))
    imp.emit(node, "Div", [one, imp.value(node.input[0])], {})


_UNARY = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
          "Sqrt": "Sqrt", "Erf": "Erf", "Abs": "Abs", "Neg": "Neg", "HardSwish": "HardSwish",
          "Floor": "Floor", "Ceil": "Ceil", "Round": "Round", "Sign": "Sign", "Sin": "Sin", "Cos": "Cos",
          "Softsign": "Softsign"}


@converter(*_UNARY)
def _unary(imp, node, a):
    imp.emit(node, _UNARY[node.op_type], [imp.value(node.input[0])], {})


@converter("Identity", "Dropout")
def _identity(imp, node, a):
    mask = node.output[1] if len(node.output) > 1 else ""
    if mask and (mask in imp.p.outputs or any(mask in n.input for n in imp.p.nodes)):
        raise Unsupported("Dropout mask output is read")   # (a mask nothing reads: old exports declare one)
    imp.alias(node, imp.value(node.input[0]))


@converter("LeakyRelu")
def _leaky(imp, node, a):
    imp.emit(node, "LeakyRelu", [imp.value(node.input[0])], {"alpha": a.get("alpha", 0.01)})


@converter("HardSigmoid")
def _hsig(imp, node, a):
    imp.emit(node, "HardSigmoid", [imp.value(node.input[0])],
             {"alpha": a.get("alpha", 0.2), "beta": a.get("beta", 0.5)})


@converter("Gelu")
def _gelu(imp, node, a):
    imp.emit(node, "GELU", [imp.value(node.input[0])], {"approximate": a.get("approximate", "none")})


@converter("PRelu")
def _prelu(imp, node, a):
    imp.emit(node, "PRelu", [imp.value(node.input[0]), imp.value(node.input[1])], {})


@converter("Clip")
def _clip(imp, node, a):
    lo, hi = a.get("min", -F32_MAX), a.get("max", F32_MAX)
    if len(node.input) > 1 and node.input[1]:
        lo = imp.scalar(node.input[1], "min")
    if len(node.input) > 2 and node.input[2]:
        hi = imp.scalar(node.input[2], "max")
    imp.emit(node, "Clip", [imp.value(node.input[0])], {"min": max(lo, -F32_MAX), "max": min(hi, F32_MAX)})


@converter("Softmax", "LogSoftmax")
def _softmax(imp, node, a):
    shape = imp.shape(node.input[0])
    rank = len(shape)
    axis = a.get("axis", -1 if imp.p.opset >= 13 else 1) % rank
    log = node.op_type == "LogSoftmax"
    x = imp.value(node.input[0])
    wide = [i for i in range(axis, rank) if shape[i] != 1]
    if imp.p.opset >= 13 or len(wide) <= 1:   # before 13, over the axes from `axis` on, flattened
        imp.emit(node, "Softmax", [x], {"axis": wide[0] if imp.p.opset < 13 and wide else axis, "log": log})
        return
    flat = imp.b.op("Reshape", [x], {"shape": [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]},
                    f"{node.output[0]}_flat")
    soft = imp.b.op("Softmax", [flat], {"axis": 1, "log": log}, f"{node.output[0]}_flat_softmax")
    imp.emit(node, "Reshape", [soft], {"shape": list(shape)})


@converter("MaxPool", "AveragePool")
def _pool(imp, node, a):
    if len(node.output) > 1 and node.output[1]:
        raise Unsupported("MaxPool indices output")
    k = list(a["kernel_shape"])
    w = _window(imp, node, a, k)
    if any(d != 1 for d in w.pop("dilations")):
        raise Unsupported("dilated pooling")
    w.update(ceil_mode=bool(a.get("ceil_mode", 0)), count_include_pad=bool(a.get("count_include_pad", 0)),
             do_relu=False, relu_limit=-1.0)
    imp.emit(node, "MaxPool" if node.op_type == "MaxPool" else "AvgPool", [imp.value(node.input[0])], w)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _gpool(imp, node, a):
    op = "GlobalAvgPool" if node.op_type == "GlobalAveragePool" else "GlobalMaxPool"
    imp.emit(node, op, [imp.value(node.input[0])], {"keepdims": True})


@converter("BatchNormalization")
def _bn(imp, node, a):
    if a.get("training_mode", 0) or any(o for o in node.output[1:]):
        raise Unsupported("training-mode BatchNormalization")
    x, scale, bias, mean, var = node.input[:5]
    imp.emit(node, "BatchNorm", [imp.value(x), imp.value(mean), imp.value(var), imp.value(scale),
                                 imp.value(bias)], {"epsilon": a.get("epsilon", 1e-5)})


@converter("Concat")
def _concat(imp, node, a):
    rank = len(imp.shape(node.output[0]))
    imp.emit(node, "Concat", [imp.value(i) for i in node.input if i],
             {"axis": a["axis"] % rank, "do_relu": False})


@converter("Reshape", "Flatten")
def _reshape(imp, node, a):
    imp.emit(node, "Reshape", [imp.value(node.input[0])], {"shape": list(imp.shape(node.output[0]))})


@converter("Transpose")
def _transpose(imp, node, a):
    rank = len(imp.shape(node.input[0]))
    imp.emit(node, "Permute", [imp.value(node.input[0])], {"order": list(a.get("perm", range(rank)[::-1]))})


@converter("Pad")
def _pad(imp, node, a):
    rank = len(imp.shape(node.input[0]))
    if imp.p.opset < 11:
        pads, val = list(a["pads"]), a.get("value", 0.0)
    else:
        pads = imp.ints(node.input[1], "pads")
        val = imp.scalar(node.input[2], "constant_value") if len(node.input) > 2 and node.input[2] else 0.0
        if len(node.input) > 3 and node.input[3]:
            axes = [v % rank for v in imp.ints(node.input[3], "axes")]
            full = [0] * (2 * rank)
            for j, ax in enumerate(axes):
                full[ax], full[ax + rank] = pads[j], pads[j + len(axes)]
            pads = full
    mode = a.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"pad mode {mode}")
    if any(p < 0 for p in pads):
        raise Unsupported("negative pads")
    imp.emit(node, "Pad", [imp.value(node.input[0])], {"paddings": pads, "mode": mode, "val": val})


@converter("Slice")
def _slice(imp, node, a):
    rank = len(imp.shape(node.input[0]))
    if imp.p.opset < 10:
        starts, ends = list(a["starts"]), list(a["ends"])
        axes = list(a.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = imp.ints(node.input[1], "starts")
        ends = imp.ints(node.input[2], "ends")
        axes = imp.ints(node.input[3], "axes") if len(node.input) > 3 and node.input[3] \
            else list(range(len(starts)))
        steps = imp.ints(node.input[4], "steps") if len(node.input) > 4 and node.input[4] \
            else [1] * len(starts)
    big = 2 ** 62
    clamp = [max(min(v, big), -big) for v in starts], [max(min(v, big), -big) for v in ends]
    imp.emit(node, "Slice", [imp.value(node.input[0])],
             {"starts": clamp[0], "ends": clamp[1], "steps": steps, "axes": [x % rank for x in axes]})


@converter("Split")
def _split(imp, node, a):
    x = imp.shape(node.input[0])
    axis = a.get("axis", 0) % len(x)
    if len(node.input) > 1 and node.input[1]:
        sizes = imp.ints(node.input[1], "split")
    elif "split" in a:
        sizes = list(a["split"])
    else:
        n = len(node.output)
        step = -(-x[axis] // n)
        sizes = [min(step, x[axis] - i * step) for i in range(n)]
    names = list(node.output)
    if any(not n for n in names):
        raise Unsupported("unnamed Split output")
    imp.emit(node, "Split", [imp.value(node.input[0])], {"axis": axis, "split_size": sizes}, loc=names)


def _axes(imp, node, a) -> list[int] | None:
    if len(node.input) > 1 and node.input[1]:
        return imp.ints(node.input[1], "axes")
    return list(a["axes"]) if "axes" in a else None


@converter("Squeeze")
def _squeeze(imp, node, a):
    x = imp.shape(node.input[0])
    axes = _axes(imp, node, a)
    if axes is None:
        axes = [i for i, d in enumerate(x) if d == 1]
    imp.emit(node, "Squeeze", [imp.value(node.input[0])], {"axes": sorted(v % len(x) for v in axes)})


@converter("Unsqueeze")
def _unsqueeze(imp, node, a):
    rank = len(imp.shape(node.output[0]))
    axes = _axes(imp, node, a)
    imp.emit(node, "Unsqueeze", [imp.value(node.input[0])], {"axes": sorted(v % rank for v in axes)})


@converter("Resize", "Upsample")
def _resize(imp, node, a):
    x, y = imp.shape(node.input[0]), imp.shape(node.output[0])
    if len(x) < 3 or x[:2] != y[:2]:
        raise Unsupported("resize of the batch or channel axis")
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"mode {mode}")
    if a.get("antialias", 0):
        raise Unsupported("antialias")
    if node.op_type == "Upsample":
        coord, nearest = "asymmetric", "floor"
    else:
        coord = a.get("coordinate_transformation_mode", "half_pixel")
        nearest = a.get("nearest_mode", "round_prefer_floor")
    if coord not in ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn"):
        raise Unsupported(f"coordinate_transformation_mode {coord}")
    scales = None
    if node.op_type == "Upsample":
        scales = imp.const(node.input[1]) if len(node.input) > 1 else np.array(a.get("scales", []))
    elif len(node.input) > 2 and node.input[2] and imp.const(node.input[2]) is not None \
            and imp.const(node.input[2]).size:
        scales = imp.const(node.input[2])
    if scales is not None and any(float(sc) * d != o for sc, d, o in zip(scales, x, y)):
        raise Unsupported(f"scales {list(map(float, scales))} that do not give whole sizes {list(y)}")
    imp.emit(node, "Resize", [imp.value(node.input[0])],
             {"mode": "linear" if mode != "nearest" else "nearest", "coord_mode": coord,
              "nearest_mode": nearest, "target_shape": list(y[2:])})


@converter("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum")
def _reduce(imp, node, a):
    rank = len(imp.shape(node.input[0]))
    axes = _axes(imp, node, a)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            imp.alias(node, imp.value(node.input[0]))
            return
        axes = list(range(rank))
    imp.emit(node, node.op_type, [imp.value(node.input[0])],
             {"axes": sorted(v % rank for v in axes), "keepdims": bool(a.get("keepdims", 1))})


@converter("SpaceToDepth", "DepthToSpace")
def _s2d(imp, node, a):
    mode = a.get("mode", "DCR")
    imp.emit(node, node.op_type, [imp.value(node.input[0])], {"block_size": a["blocksize"], "mode": mode})


_CAST = {1: "f32", 10: "f16", 16: "bf16", 3: "i8", 2: "u8", 6: "i32", 7: "i64"}


@converter("Cast")
def _cast(imp, node, a):
    to = _CAST.get(a["to"])
    if to is None:
        raise Unsupported(f"cast to ONNX type {a['to']}")
    imp.emit(node, "Cast", [imp.value(node.input[0])], {"to": to})


@converter("Gather")
def _gather(imp, node, a):
    rank = len(imp.shape(node.input[0]))
    idx = imp.const(node.input[1])
    if idx is not None:
        idx_v = imp.weight(node.input[1], idx.astype(np.int64))
    else:
        idx_v = imp.value(node.input[1])
    imp.emit(node, "Gather", [imp.value(node.input[0]), idx_v], {"axis": a.get("axis", 0) % rank})


@converter("InstanceNormalization")
def _instance_norm(imp, node, a):
    """Instance norm: a LayerNorm over each image's and channel's spatial axes, per-channel
    scale and bias."""
    shape = imp.shape(node.input[0])
    if len(shape) < 3:
        raise Unsupported(f"{len(shape)}-D input")
    operands = [imp.value(node.input[0])]
    for k, name in ((1, "scale"), (2, "bias")):
        arr = imp.const(node.input[k])
        if arr is None:
            raise Unsupported(f"non-constant {name}")
        per_channel = arr.astype(np.float32).reshape((1, -1) + (1,) * (len(shape) - 2))
        operands.append(imp.weight(f"{node.output[0]}_{name}", per_channel))
    imp.emit(node, "LayerNorm", operands, {"axes": list(range(2, len(shape))), "eps": a.get("epsilon", 1e-5)})


def _exp_plus_one(imp, x, out: str):
    """1 + exp(x), whose log is softplus (an exp that overflows gives inf, and log(inf) the right limit)."""
    e = imp.b.op("Exp", [x], {}, f"{out}_exp")
    return imp.b.op("Add", [e, imp.weight(f"{out}_one", np.array(1.0, np.float32))], {}, f"{out}_exp_plus_one")


@converter("Softplus", "Mish")
def _softplus_mish(imp, node, a):
    """Softplus and Mish (x * tanh(softplus(x)), YOLOv4's activation) in the element-wise ops TOP has."""
    x, out = imp.value(node.input[0]), node.output[0]
    if node.op_type == "Softplus":
        imp.emit(node, "Log", [_exp_plus_one(imp, x, out)], {})
        return
    softplus = imp.b.op("Log", [_exp_plus_one(imp, x, out)], {}, f"{out}_softplus")
    imp.emit(node, "Mul", [x, imp.b.op("Tanh", [softplus], {}, f"{out}_tanh")], {})


@converter("Elu", "Selu")
def _elu(imp, node, a):
    """Elu: relu(x) + alpha * (exp(min(x, 0)) - 1); Selu: gamma times that (its own alpha)."""
    x, out = imp.value(node.input[0]), node.output[0]
    selu = node.op_type == "Selu"
    alpha = float(a.get("alpha", 1.6732632423543772 if selu else 1.0))
    gamma = float(a.get("gamma", 1.0507009873554805)) if selu else 1.0
    w = lambda name, v: imp.weight(f"{out}_{name}", np.array(v, np.float32))  # noqa: E731
    neg = imp.b.op("Exp", [imp.b.op("Min", [x, w("zero", 0.0)], {}, f"{out}_negative")], {}, f"{out}_exp")
    neg = imp.b.op("Mul", [imp.b.op("Sub", [neg, w("one", 1.0)], {}, f"{out}_expm1"), w("alpha", alpha * gamma)], {},
                   f"{out}_negative_part")
    pos = imp.b.op("Relu", [x], {}, f"{out}_positive")
    if selu:
        pos = imp.b.op("Mul", [pos, w("gamma", gamma)], {}, f"{out}_positive_part")
    imp.emit(node, "Add", [pos, neg], {})


@converter("LpNormalization", "ReduceL2", "ReduceSumSquare")
def _l2(imp, node, a):
    """x / ||x||_2 along an axis (a face embedding's normalization), the L2 norm, the sum of squares."""
    shape = imp.shape(node.input[0])
    rank, x, out = len(shape), imp.value(node.input[0]), node.output[0]
    if node.op_type == "LpNormalization":
        if a.get("p", 2) != 2:
            raise Unsupported(f"p = {a.get('p')} (only the L2 norm imports)")
        axes, keep = [a.get("axis", -1) % rank], True
    else:
        axes = _axes(imp, node, a)
        if not axes and a.get("noop_with_empty_axes", 0):   # no reduction: x^2 or |x|
            imp.emit(node, *(("Mul", [x, x]) if node.op_type == "ReduceSumSquare" else ("Abs", [x])), {})
            return
        axes, keep = sorted(v % rank for v in axes) if axes else list(range(rank)), bool(a.get("keepdims", 1))
    square = imp.b.op("Mul", [x, x], {}, f"{out}_square")
    if node.op_type == "ReduceSumSquare":
        imp.emit(node, "ReduceSum", [square], {"axes": axes, "keepdims": keep})
        return
    total = imp.b.op("ReduceSum", [square], {"axes": axes, "keepdims": keep}, f"{out}_sum_of_squares")
    if node.op_type == "ReduceL2":
        imp.emit(node, "Sqrt", [total], {})
        return
    imp.emit(node, "Div", [x, imp.b.op("Sqrt", [total], {}, f"{out}_norm")], {})


@converter("Mean")
def _mean(imp, node, a):
    """The element-wise mean of the inputs: their sum over their count."""
    vals = [imp.value(i) for i in node.input]
    total = vals[0]
    for k, v in enumerate(vals[1:]):
        total = imp.b.op("Add", [total, v], {}, f"{node.output[0]}_sum{k}")
    imp.emit(node, "Mul", [total, imp.weight(f"{node.output[0]}_inverse_count", np.array(1.0 / len(vals), np.float32))], {})


@converter("LayerNormalization")
def _layer_norm(imp, node, a):
    if any(o for o in node.output[1:]):
        raise Unsupported("Mean / InvStdDev outputs")
    rank = len(imp.shape(node.input[0]))
    axis = a.get("axis", -1) % rank
    if a.get("stash_type", 1) != 1:
        raise Unsupported("stash_type other than float")
    operands = [imp.value(node.input[0])]
    for k, name in ((1, "scale"), (2, "bias")):
        if len(node.input) > k and node.input[k]:
            arr = imp.const(node.input[k])
            if arr is None:
                raise Unsupported(f"non-constant {name}")
            full = (1,) * (rank - arr.ndim) + arr.shape
            operands.append(imp.weight(f"{node.output[0]}_{name}", arr.astype(np.float32).reshape(full)))
        else:
            operands.append(imp.b.none())
    imp.emit(node, "LayerNorm", operands, {"axes": list(range(axis, rank)), "eps": a.get("epsilon", 1e-5)})


@converter("Expand")
def _expand(imp, node, a):
    """Broadcast to a constant shape: a multiply by ones over the new extents (exact, -0.0 kept)."""
    imp.need_const(node.input[1], "shape")  # the output shape ONNX inferred from it is used below
    src = imp.shape(node.input[0])
    out = imp.shape(node.output[0])
    x = imp.value(node.input[0])
    if tuple(out) == tuple(src):
        imp.alias(node, x)
        return
    if imp.p.dtypes.get(node.output[0], np.float32) != np.float32:
        raise Unsupported("non-float32 Expand")
    pad = [1] * (len(out) - len(src)) + list(src)
    ones_shape = [o if p == 1 and o != 1 else 1 for o, p in zip(out, pad)]
    ones = imp.weight(f"{node.output[0]}_ones", np.ones(ones_shape, np.float32))
    imp.emit(node, "Mul", [x, ones], {})


@converter("Tile")
def _tile(imp, node, a):
    """Repeat along each axis by a constant count: a Concat of that many copies per axis (exact
    data movement, any dtype). Keras's UpSampling2D and `tf.repeat` export as Unsqueeze -> Tile ->
    Reshape."""
    reps = [int(r) for r in np.ravel(imp.need_const(node.input[1], "repeats"))]
    src = imp.shape(node.input[0])
    if len(reps) != len(src) or any(r < 1 for r in reps):
        raise Unsupported(f"repeats {reps} for a rank-{len(src)} input")
    x = imp.value(node.input[0])
    axes = [ax for ax, r in enumerate(reps) if r > 1]
    if not axes:
        imp.alias(node, x)
        return
    for ax in axes[:-1]:
        x = imp.b.op("Concat", [x] * reps[ax], {"axis": ax, "do_relu": False}, f"{node.output[0]}_tile{ax}")
    imp.emit(node, "Concat", [x] * reps[axes[-1]], {"axis": axes[-1], "do_relu": False})


from tftpu.frontend import onnx_recurrent  # noqa: E402,F401  (registers LSTM and GRU)

SUPPORTED = sorted(name[5:] for name in CONVERTERS)   # the ONNX op types imported
