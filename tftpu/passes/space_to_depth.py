"""Automatic space-to-depth (S2D) of the first strided convolution fed by the input.

The pass finds each Conv2D (NHWC) / Conv3D (NDHWC) reached from an input (an IteratorGetNext
output, one per replica under tf.distribute, or a function argument) through Identity, Cast, Pad
and per-channel elementwise preprocessing (Keras Rescaling, Normalization). Where the target's
cost model says it pays, it:

- inserts SpaceToDepth right after the input, on the input's (host) device;
- moves the preprocessing after it, with per-channel constants tiled b*b times;
- pads/crops the S2D tensor and runs the conv VALID with stride s/b on the transformed kernel
  (padded top/left to a multiple of b right after its variable read; the variable keeps its shape);
- rewrites the kernel gradient (Conv2DBackpropFilter / Conv3DBackpropFilterV2) and removes the
  unused image gradient (Conv2DBackpropInput).

Index arithmetic: `tftpu.passes.s2d_geometry`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from tftpu.errors import ShapeError, UsageError
from tftpu.graph.pass_manager import GraphContext, Pass, PassResult
from tftpu.graph.surgery import GraphEditor, parse, ref
from tftpu.passes import s2d_geometry as geo
from tftpu.passes.cost import ConvGeometry

ITERATOR_OPS = {"IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard",
                "OptionalGetValue"}
CONV_OPS = {"Conv2D": 2, "Conv3D": 3}
FILTER_GRAD_OPS = {"Conv2D": "Conv2DBackpropFilter", "Conv3D": "Conv3DBackpropFilterV2"}
INPUT_GRAD_OPS = {"Conv2D": "Conv2DBackpropInput", "Conv3D": "Conv3DBackpropInputV2"}
FORMATS = {"Conv2D": b"NHWC", "Conv3D": b"NDHWC"}
TRANSPARENT = {"Identity", "Snapshot", "StopGradient"}
ZERO_UNARY = {"Cast", "Relu", "Relu6", "Neg", "Abs", "Square", "Sqrt", "Tanh", "Sign", "Floor",
              "Ceil", "Round", "Rint", "Sin"}
OTHER_UNARY = {"Exp", "Sigmoid", "Reciprocal", "Rsqrt", "Log1p", "Softplus"}
BINARY = {"Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "Maximum", "Minimum", "BiasAdd",
          "SquaredDifference"}
IGNORED_CONSUMERS = {"Shape", "ShapeN", "Size", "Rank", "Conv2DBackpropFilter",
                     "Conv3DBackpropFilterV2"}
MAX_CHAIN = 32


@dataclasses.dataclass
class Step:
    """One op between the input and the conv: its node, and for binary ops the data side."""

    node: object
    data_index: int = 0
    other: str | None = None
    pads: object = None          # [rank, 2] for Pad/PadV2

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def zero_preserving(self) -> bool:
        if self.op in TRANSPARENT or self.op in ZERO_UNARY or self.pads is not None:
            return True
        if self.op == "Mul":
            return True
        return self.op in ("RealDiv", "Div") and self.data_index == 0


@dataclasses.dataclass
class Candidate:
    """A conv reached from an input, and the chain of ops in between."""

    source: str
    conv: object
    chain: list


class Decline(Exception):
    """A candidate the pass will not rewrite; the message is the reason."""

    def __init__(self, reason: str, **numbers):
        super().__init__(reason)
        self.numbers = numbers


class SpaceToDepthPass(Pass):
    """Space-to-depth of the first strided conv; options: block_size, block_depth (Conv3D)."""

    name = "space_to_depth"

    def __init__(self, block_size: int = 2, block_depth: bool = True, force: bool = False):
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 2:
            raise UsageError(f"space_to_depth block_size {block_size!r}: expected an int >= 2")
        self.block_size = int(block_size)
        self.block_depth = block_depth
        self.force = force

    def apply(self, ctx: GraphContext) -> PassResult:
        result = PassResult(self.name)
        ed = ctx.editor
        rewriter = _Rewriter(ed, ctx, self)
        sources = rewriter.sources()
        candidates, blockers = [], []
        for src in sources:
            found, blocked = rewriter.find_convs(src)
            candidates += found
            blockers += blocked
        if not candidates:
            stop = ", ".join(sorted({f"{n.op} ({n.name})" for n in blockers})[:4]) or "nothing"
            result.decline("graph", f"no Conv2D/Conv3D fed by the inputs {sources or '(none)'}; "
                                    f"walk stopped at {stop}")
            return result
        seen = set()
        for cand in candidates:
            if cand.conv.name in seen:
                continue
            seen.add(cand.conv.name)
            try:
                reason, numbers = rewriter.rewrite(cand)
            except Decline as d:
                result.decline(cand.conv.name, str(d), **d.numbers)
            else:
                result.apply(cand.conv.name, reason, **numbers)
        return result


class _Rewriter:
    def __init__(self, ed: GraphEditor, ctx: GraphContext, opts: SpaceToDepthPass):
        self.ed = ed
        self.ctx = ctx
        self.opts = opts
        self._host_cache = {}
        self._dep_cache = {}
        self._source_nodes = set()

    # --- finding -------------------------------------------------------------------------
    def sources(self) -> list[str]:
        out = []
        for node in list(self.ed.nodes):
            if node.op in ITERATOR_OPS:
                self._source_nodes.add(node.name)
                n_out = len(node.attr["output_types"].list.type) if "output_types" in node.attr else 1
                out += [ref(node.name, i) for i in range(n_out)]
        for t in self.ctx.arg_names:
            name = parse(t)[0]
            if self.ed.has(name):
                self._source_nodes.add(name)
                out.append(ref(name, parse(t)[1]))
        return out

    def depends_on_input(self, tensor: str) -> bool:
        """True if `tensor` is computed from an input (so it is not a per-channel constant)."""
        start = parse(tensor)[0]
        if start in self._dep_cache:
            return self._dep_cache[start]
        stack, seen, hit = [start], set(), False
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self._source_nodes:
                hit = True
                break
            for inp in self.ed.node(name).input:
                stack.append(parse(inp)[0])
        self._dep_cache[start] = hit
        return hit

    def per_channel(self, other: str, channels: int | None, rank: int | None) -> bool:
        """True if `other` broadcasts along the channels only and does not depend on an input."""
        shape = self.ed.output_shape(other)
        if shape is None or rank is None or len(shape) > rank or any(d is None for d in shape):
            return False
        if any(d != 1 for d in shape[:-1]):
            return False
        if shape and shape[-1] not in (1, channels):
            return False
        return not self.depends_on_input(other)

    def find_convs(self, src: str):
        ed = self.ed
        found, blocked = [], []
        src_shape = ed.output_shape(src)
        channels = src_shape[-1] if src_shape else None
        rank = len(src_shape) if src_shape else None
        stack = [(src, [])]
        while stack:
            tensor, chain = stack.pop()
            if len(chain) > MAX_CHAIN:
                continue
            for node, i in ed.consumers(tensor):
                op = node.op
                out = ref(node.name, 0)
                if op in CONV_OPS and i == 0:
                    found.append(Candidate(src, node, chain))
                elif op in IGNORED_CONSUMERS:
                    continue
                elif (op in TRANSPARENT or op in ZERO_UNARY or op in OTHER_UNARY) and i == 0:
                    stack.append((out, chain + [Step(node)]))
                elif op in BINARY and i in (0, 1) and not (op == "BiasAdd" and (
                        i == 1 or node.attr["data_format"].s not in (b"", b"NHWC"))):
                    other = node.input[1 - i]
                    if self.per_channel(other, channels, rank):
                        stack.append((out, chain + [Step(node, i, other)]))
                    else:
                        blocked.append(node)
                elif op in ("Pad", "PadV2") and i == 0:
                    pads = ed.const_value(node.input[1])
                    const_ok = op == "Pad" or _is_zero(ed.const_value(node.input[2]))
                    if pads is not None and const_ok:
                        stack.append((out, chain + [Step(node, pads=pads)]))
                    else:
                        blocked.append(node)
                else:
                    blocked.append(node)
        return found, blocked

    # --- rewriting -----------------------------------------------------------------------
    def rewrite(self, cand: Candidate):
        import tensorflow as tf

        ed, conv, b = self.ed, cand.conv, self.opts.block_size
        n = CONV_OPS[conv.op]
        if conv.attr["data_format"].s != FORMATS[conv.op]:
            raise Decline(f"data format {conv.attr['data_format'].s.decode()} (only {FORMATS[conv.op].decode()})")
        if any(d != 1 for d in conv.attr["dilations"].list.i):
            raise Decline(f"dilation {list(conv.attr['dilations'].list.i)[1:-1]}")
        strides = list(conv.attr["strides"].list.i)[1:-1]
        hw = strides[-2:]
        if hw[0] != hw[1]:
            raise Decline(f"unequal spatial strides {strides}")
        s = hw[0]
        if s == 1:
            raise Decline("stride 1: nothing to fold into channels")
        if b < 2 or s % b:
            raise Decline(f"block size {b} does not divide stride {s}")
        blocks = [b] * n
        if n == 3:
            blocks[0] = b if (self.opts.block_depth and strides[0] % b == 0) else 1

        src_shape = ed.output_shape(cand.source)
        kernel_t = conv.input[1]
        k_shape = ed.output_shape(kernel_t)
        if src_shape is None or len(src_shape) != n + 2 or any(d is None for d in src_shape[1:]):
            raise Decline(f"input {cand.source} has no static spatial shape ({src_shape})")
        if k_shape is None or any(d is None for d in k_shape):
            raise Decline(f"kernel {kernel_t} has no static shape")
        spatial, channels = src_shape[1:-1], src_shape[-1]
        kernel, out_ch = k_shape[:-2], k_shape[-1]

        # Explicit Pad ops fold into the conv's own padding; they must not precede ops that
        # would turn the padded zeros into something else.
        pre = [[0, 0] for _ in range(n)]
        for idx, step in enumerate(cand.chain):
            if step.pads is None:
                continue
            p = step.pads
            if p.shape != (n + 2, 2) or p[0].any() or p[-1].any():
                raise Decline(f"{step.node.name}: Pad of batch or channels {p.tolist()}")
            later = [x for x in cand.chain[idx + 1:] if not x.zero_preserving]
            if later:
                raise Decline(f"{step.node.name}: Pad before {later[0].op} ({later[0].node.name}) "
                              f"would shift the padded zeros")
            for a in range(n):
                pre[a][0] += int(p[1 + a][0])
                pre[a][1] += int(p[1 + a][1])
        padding = conv.attr["padding"].s.decode()
        plans = []
        for a in range(n):
            size_in = spatial[a] + pre[a][0] + pre[a][1]
            if padding == "SAME":
                cp = geo.same_pads(size_in, kernel[a], strides[a])
            elif padding == "VALID":
                cp = (0, 0)
            elif padding == "EXPLICIT":
                ex = list(conv.attr["explicit_paddings"].list.i)
                cp = (ex[2 * (1 + a)], ex[2 * (1 + a) + 1])
            else:
                raise Decline(f"padding {padding}")
            try:
                plans.append(geo.AxisPlan(spatial[a], kernel[a], strides[a], blocks[a],
                                          (pre[a][0] + cp[0], pre[a][1] + cp[1])))
            except ShapeError as e:
                raise Decline(str(e)) from None

        batch = src_shape[0]
        host_dtype = ed.output_dtype(cand.source)
        bprod = math.prod(blocks)
        g0 = ConvGeometry(batch or 1, spatial, [p.out for p in plans], kernel, channels, out_ch,
                          host_dtype.size)
        g1 = ConvGeometry(batch or 1, [p.begin + p.blocked_size + p.end for p in plans],
                          [p.out for p in plans], [p.new_kernel for p in plans], channels * bprod,
                          out_ch, host_dtype.size)
        est = self.ctx.target.s2d_estimate(g0, g1)
        numbers = {"target": self.ctx.target.name, "batch": batch if batch else "unknown(1)",
                   **est}
        desc = (f"{conv.op} k={'x'.join(map(str, kernel))} s={s} {padding}"
                f"{' +Pad' if any(x.pads is not None for x in cand.chain) else ''} C={channels}")
        if est["speedup"] < self.ctx.target.min_speedup and not self.opts.force:
            raise Decline(f"{desc}: S2D estimated {est['speedup']:.2f}x on target "
                          f"{self.ctx.target.name} (needs {self.ctx.target.min_speedup}x)", **numbers)

        device = conv.device
        src_node = ed.node(cand.source)
        old_in, old_kernel = conv.input[0], conv.input[1]
        old_strides = list(conv.attr["strides"].list.i)
        old_padding = conv.attr["padding"].s

        # 1. host: pad to a multiple of b, SpaceToDepth, on the input's device.
        key = (cand.source, tuple(blocks))
        if key not in self._host_cache:
            [x] = ed.splice(lambda x: geo.space_to_depth(geo.pad_input(x, plans), blocks),
                            [cand.source], prefix=f"{src_node.name}/space_to_depth",
                            device=src_node.device)
            self._host_cache[key] = x
        x = self._host_cache[key]

        # 2. device: the preprocessing, moved after S2D with tiled per-channel operands.
        base = f"{conv.name}/s2d"
        moved = []
        for step in cand.chain:
            if step.op in TRANSPARENT or step.pads is not None:
                continue
            attrs = {k: v for k, v in step.node.attr.items() if k != "_output_shapes"}
            if step.other is None:
                node = ed.add_node(step.op, f"{base}/{step.op}", [x], attrs, device)
            else:
                other = self._tile(step.other, channels, bprod, f"{base}/tile", device)
                inputs = [x, other] if step.data_index == 0 else [other, x]
                node = ed.add_node(step.op, f"{base}/{step.op}", inputs, attrs, device)
            moved.append(step.op)
            x = ref(node.name)
        if moved and any(p.size_pad for p in plans) and not all(st.zero_preserving for st in cand.chain):
            mask = _s2d_mask(plans, blocks, channels)
            [x] = ed.splice(lambda y: tf.where(tf.constant(mask), y, tf.zeros((), y.dtype)),
                            [x], prefix=f"{base}/mask", device=device,
                            dtypes=[ed.output_dtype(conv.input[0])], shapes=[None])

        # 3. device: pad/crop the S2D tensor so a VALID conv reads the original taps.
        conv_dtype = tf.dtypes.as_dtype(conv.attr["T"].type)
        [x] = ed.splice(lambda y: geo.pad_blocked(y, plans), [x], prefix=f"{base}/pad",
                        device=device, dtypes=[conv_dtype], shapes=[None])
        # 4. kernel: transformed right after its read; the variable keeps its shape.
        [k] = ed.splice(lambda w: geo.transform_kernel(w, plans), [old_kernel],
                        prefix=f"{base}/kernel", device=device)
        new_strides = [1] + [p.new_stride for p in plans] + [1]
        ed.set_input(conv, 0, x)
        ed.set_input(conv, 1, k)
        conv.attr["strides"].list.i[:] = new_strides
        conv.attr["padding"].s = b"VALID"
        if "explicit_paddings" in conv.attr:
            del conv.attr["explicit_paddings"].list.i[:]

        # 5. gradients.
        notes = self._rewrite_grads(conv, old_in, old_kernel, old_strides, old_padding, x, plans,
                                    channels, out_ch, device)
        ed.remove_dead([st.node.name for st in reversed(cand.chain)])
        reason = (f"{desc} -> SpaceToDepth(b={'x'.join(map(str, blocks))}) on "
                  f"{src_node.device or 'the input device'} after {src_node.name}, "
                  f"{conv.op} k={'x'.join(str(p.new_kernel) for p in plans)} "
                  f"s={plans[-1].new_stride} C={channels * bprod}"
                  + (f"; moved {'+'.join(moved)} after S2D" if moved else "")
                  + (f"; {notes}" if notes else "")
                  + f"; est. {est['speedup']:.2f}x on {self.ctx.target.name}")
        return reason, numbers

    def _tile(self, other: str, channels: int, bprod: int, prefix: str, device: str) -> str:
        import tensorflow as tf

        shape = self.ed.output_shape(other)
        if not shape or shape[-1] == 1:
            return other

        def tile(p):
            v = tf.tile(tf.reshape(p, [channels]), [bprod])
            return tf.reshape(v, list(shape[:-1]) + [channels * bprod])

        [t] = self.ed.splice(tile, [other], prefix=prefix, device=device)
        return t

    def _rewrite_grads(self, conv, old_in, old_kernel, old_strides, old_padding, x, plans,
                       channels, out_ch, device) -> str:
        import tensorflow as tf

        ed = self.ed
        notes = []
        bf_op, bi_op = FILTER_GRAD_OPS[conv.op], INPUT_GRAD_OPS[conv.op]
        grads = []
        for node, i in ed.consumers(old_in):
            if node.op != bf_op or i != 0:
                continue
            if list(node.attr["strides"].list.i) != old_strides or node.attr["padding"].s != old_padding:
                continue
            if not self._sizes_of(node.input[1], old_kernel):
                continue
            grads.append(node)
        new_k = [p.new_kernel for p in plans] + [channels * math.prod(p.block for p in plans), out_ch]
        for bf in grads:
            sizes = ed.add_node("Const", f"{bf.name}/s2d/filter_sizes", attrs={
                "dtype": tf.compat.v1.AttrValue(type=tf.int32.as_datatype_enum),
                "value": tf.compat.v1.AttrValue(tensor=tf.make_tensor_proto(new_k, tf.int32))},
                device=bf.device)
            attrs = {k: v for k, v in bf.attr.items() if k != "_output_shapes"}
            new_bf = ed.add_node(bf.op, f"{bf.name}/s2d", [x, sizes.name, bf.input[2]], attrs, bf.device)
            new_bf.attr["strides"].list.i[:] = list(conv.attr["strides"].list.i)
            new_bf.attr["padding"].s = b"VALID"
            if "explicit_paddings" in new_bf.attr:
                del new_bf.attr["explicit_paddings"].list.i[:]
            dtype = tf.dtypes.as_dtype(bf.attr["T"].type)
            [g] = ed.splice(lambda w: geo.untransform_kernel(w, plans, channels), [new_bf.name],
                            prefix=f"{bf.name}/s2d/untransform", device=bf.device,
                            dtypes=[dtype], shapes=[new_k])
            ed.replace_uses(bf.name, g)
            for c in ed.control_consumers(bf.name):
                c.input[list(c.input).index("^" + bf.name)] = "^" + parse(g)[0]
            bi_removed = self._drop_input_grad(bi_op, old_kernel, bf.input[2], old_strides, notes)
            ed.remove([bf.name])
            ed.remove_dead([parse(bf.input[1])[0]])
            notes.append(f"rewrote {bf.op}" + (" and removed its Conv2DBackpropInput" if bi_removed else ""))
        return "; ".join(notes)

    def _drop_input_grad(self, bi_op, old_kernel, grad, old_strides, notes) -> bool:
        ed = self.ed
        removed = False
        for node, i in ed.consumers(old_kernel):
            if node.op != bi_op or i != 1 or node.input[2] != grad:
                continue
            if list(node.attr["strides"].list.i) != old_strides:
                continue
            users = ed.consumers(node.name)
            if users or ed.control_consumers(node.name):
                notes.append(f"kept {node.name} (the image gradient is used by {users[0][0].name if users else 'a control edge'})")
                continue
            sizes = parse(node.input[0])[0]
            ed.remove([node.name])
            ed.remove_dead([sizes])
            removed = True
        return removed

    def _sizes_of(self, sizes: str, kernel: str) -> bool:
        """True if tensor `sizes` is the shape of `kernel` (ShapeN/Shape of it, or a Const)."""
        ed = self.ed
        name, idx = parse(sizes)
        node = ed.node(name)
        if node.op == "ShapeN":
            return idx < len(node.input) and node.input[idx] == kernel
        if node.op == "Shape":
            return node.input[0] == kernel
        value = ed.const_value(sizes)
        return value is not None and list(value) == ed.output_shape(kernel)


def _is_zero(value) -> bool:
    return value is not None and not value.any()


def _s2d_mask(plans, blocks, channels):
    """Boolean [1, *blocked, C*prod(b)] mask: True where the S2D tensor holds real pixels."""
    import numpy as np

    n = len(plans)
    full = np.zeros([1] + [p.blocked_size * p.block for p in plans] + [channels], dtype=bool)
    full[(slice(None),) + tuple(slice(0, p.size) for p in plans)] = True
    shape = [1]
    for p in plans:
        shape += [p.blocked_size, p.block]
    y = full.reshape(shape + [channels])
    perm = [0] + [1 + 2 * i for i in range(n)] + [2 + 2 * i for i in range(n)] + [1 + 2 * n]
    y = y.transpose(perm)
    return y.reshape([1] + [p.blocked_size for p in plans] + [channels * math.prod(blocks)])
