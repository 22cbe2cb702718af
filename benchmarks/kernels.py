"""Per-op speed of the TOP kernels against onnxruntime on ResNet50 / MobileNetV2 shapes.

    python benchmarks/kernels.py [--repeat 20] [--only conv]
    python benchmarks/kernels.py --model resnet50.onnx [--model mobilenetv2.onnx]

Each row runs one op at a batch-1 shape from the two networks, in onnxruntime (a one-node
model) and through `tftpu.interp.kernels`, and prints the median times and ORT/TOP throughput
ratio (>= 1 means the kernel is as fast as onnxruntime). The weighted total sums each op times
its count in the network, an estimate of whole-model kernel throughput. onnxruntime runs with
denormals flushed to zero, as TensorFlow does.

With --model, a plain-CNN ONNX file (Conv/Relu/Clip/Add/Mul/Pad/pools/MatMul/Gemm/...; e.g.
keras.applications ResNet50 or MobileNetV2 through tf2onnx) runs node by node on the kernels
(a minimal walker for timing only; the TOP interpreter is tftpu.interp's job) and whole in
onnxruntime, and the throughput ratio is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tftpu.interp.kernels import KERNELS

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def ort_options():
    """onnxruntime session options for a fair race: denormals flushed to zero, as TF does
    (random-weight ResNet50 runs ~1.8x slower in onnxruntime without it)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    return so


def _session(op_type, x, consts, attrs, n_out=1):
    inits = [numpy_helper.from_array(c, f"c{i}") for i, c in enumerate(consts) if c is not None]
    names = ["x"] + [f"c{i}" if c is not None else "" for i, c in enumerate(consts)]
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None)
         for i in range(n_out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), ort_options(),
                                providers=["CPUExecutionProvider"])


def _median_time(fn, repeat):
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _conv(c, o, hw, k, s, g=1, relu=True):
    x, w, b = _rand(1, c, hw, hw), _rand(o, c // g, k, k) * 0.1, _rand(o)
    p = k // 2
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p], group=g)
    return ("Conv", x, [w, b], attrs, "Conv", [w, b], dict(attrs, do_relu=relu))


def _pool(kind, c, hw, k, s, p):
    x = _rand(1, c, hw, hw)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    return ({"MaxPool": "MaxPool", "AvgPool": "AveragePool"}[kind], x, [], attrs, kind, [], attrs)


def cases():
    """(label, count in network, case) for ResNet50 and MobileNetV2 at batch 1, 224x224."""
    fc_w, fc_b = _rand(2048, 1000) * 0.01, _rand(1000)
    x_fc = _rand(1, 2048)
    a56 = _rand(1, 256, 56, 56)
    return [
        ("resnet conv1 7x7/2 3->64 @224", 1, _conv(3, 64, 224, 7, 2)),
        ("resnet maxpool 3x3/2 @112", 1, _pool("MaxPool", 64, 112, 3, 2, 1)),
        ("resnet conv 1x1 64->64 @56", 3, _conv(64, 64, 56, 1, 1)),
        ("resnet conv 3x3 64->64 @56", 3, _conv(64, 64, 56, 3, 1)),
        ("resnet conv 1x1 64->256 @56", 4, _conv(64, 256, 56, 1, 1)),
        ("resnet conv 1x1 256->64 @56", 2, _conv(256, 64, 56, 1, 1)),
        ("resnet conv 3x3/2 128 @56", 1, _conv(128, 128, 56, 3, 2)),
        ("resnet conv 3x3 128 @28", 3, _conv(128, 128, 28, 3, 1)),
        ("resnet conv 1x1 128->512 @28", 5, _conv(128, 512, 28, 1, 1)),
        ("resnet conv 1x1 512->128 @28", 3, _conv(512, 128, 28, 1, 1)),
        ("resnet conv 3x3 256 @14", 6, _conv(256, 256, 14, 3, 1)),
        ("resnet conv 1x1 256->1024 @14", 7, _conv(256, 1024, 14, 1, 1)),
        ("resnet conv 1x1 1024->256 @14", 5, _conv(1024, 256, 14, 1, 1)),
        ("resnet conv 3x3 512 @7", 3, _conv(512, 512, 7, 3, 1)),
        ("resnet conv 1x1 512->2048 @7", 4, _conv(512, 2048, 7, 1, 1)),
        ("resnet conv 1x1 2048->512 @7", 2, _conv(2048, 512, 7, 1, 1)),
        ("resnet add+relu 256 @56", 3, ("Add", a56, [_rand(1, 256, 56, 56)], {}, "Add",
                                        [None], dict(do_relu=True))),
        ("resnet global avgpool 2048 @7", 1, ("GlobalAveragePool", _rand(1, 2048, 7, 7), [],
                                              {}, "GlobalAvgPool", [], {})),
        ("resnet fc 2048->1000", 1, ("Gemm", x_fc, [fc_w, fc_b], {}, "MatMul", [fc_w, fc_b],
                                     {})),
        ("mobilenet dw 3x3 32 @112", 1, _conv(32, 32, 112, 3, 1, g=32)),
        ("mobilenet dw 3x3/2 96 @112", 1, _conv(96, 96, 112, 3, 2, g=96)),
        ("mobilenet dw 3x3 144 @56", 1, _conv(144, 144, 56, 3, 1, g=144)),
        ("mobilenet dw 3x3 192 @28", 2, _conv(192, 192, 28, 3, 1, g=192)),
        ("mobilenet dw 3x3 384 @14", 3, _conv(384, 384, 14, 3, 1, g=384)),
        ("mobilenet dw 3x3 960 @7", 2, _conv(960, 960, 7, 3, 1, g=960)),
        ("mobilenet conv 1x1 24->144 @56", 1, _conv(24, 144, 56, 1, 1)),
        ("mobilenet conv 1x1 64->384 @14", 3, _conv(64, 384, 14, 1, 1)),
        ("mobilenet conv 1x1 160->960 @7", 2, _conv(160, 960, 7, 1, 1)),
        ("mobilenet avgpool 2x2/2 @14", 1, _pool("AvgPool", 96, 14, 2, 2, 0)),
        ("resize linear x2 64 @28", 1, (
            "Resize", _rand(1, 64, 28, 28), [None, None, np.array([1, 64, 56, 56], np.int64)],
            dict(mode="linear"), "Resize", [],
            dict(mode="linear", coord_mode="half_pixel", target_shape=[56, 56]))),
    ]


def _attr_dict(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _decode(v):
    return v.decode() if isinstance(v, bytes) else v


def _plan(model):
    """(kernel, attrs, input names, output names) per node; constant inputs folded to attrs."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    steps = []
    for node in model.graph.node:
        a = {k: _decode(v) for k, v in _attr_dict(node).items()}
        ins = list(node.input)
        op = node.op_type
        if op == "Conv":
            k, attrs = "Conv", dict(strides=a.get("strides"), pads=a.get("pads"),
                                    dilations=a.get("dilations"), group=a.get("group", 1),
                                    kernel_shape=a.get("kernel_shape"))
            ins = ins + [""] * (3 - len(ins))
        elif op == "Relu":
            k, attrs = "Relu", {}
        elif op == "Clip":
            lo = consts[ins[1]] if len(ins) > 1 and ins[1] else None
            hi = consts[ins[2]] if len(ins) > 2 and ins[2] else None
            k, attrs, ins = "Clip", dict(min=None if lo is None else float(lo),
                                         max=None if hi is None else float(hi)), ins[:1]
        elif op in ("Add", "Mul", "Sub", "Div", "MatMul", "Softmax"):
            k, attrs = op, dict(axis=a.get("axis", -1)) if op == "Softmax" else {}
            if op == "MatMul":
                ins = ins + [""]
        elif op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise SystemExit("benchmark walker: Gemm with transA/alpha/beta")
            k, attrs = "MatMul", dict(right_transpose=bool(a.get("transB", 0)))
        elif op == "Pad":
            p = consts[ins[1]].tolist()
            val = float(consts[ins[2]]) if len(ins) > 2 and ins[2] else 0.0
            attrs = dict(paddings=p, mode=a.get("mode", "constant"), val=val)
            k, ins = "Pad", ins[:1]
        elif op == "Transpose":
            k, attrs = "Permute", dict(order=a["perm"])
        elif op in ("MaxPool", "AveragePool"):
            k = "MaxPool" if op == "MaxPool" else "AvgPool"
            attrs = dict(kernel_shape=a["kernel_shape"], strides=a.get("strides"),
                         pads=a.get("pads"), ceil_mode=bool(a.get("ceil_mode", 0)),
                         count_include_pad=bool(a.get("count_include_pad", 0)))
        elif op in ("GlobalAveragePool", "GlobalMaxPool"):
            k, attrs = op.replace("Average", "Avg"), {}
        elif op == "Squeeze":
            k, attrs, ins = "Squeeze", dict(axes=consts[ins[1]].tolist() if len(ins) > 1 else []), \
                ins[:1]
        elif op == "Reshape":
            k, attrs, ins = "Reshape", dict(shape=consts[ins[1]].tolist()), ins[:1]
        elif op == "Flatten":
            k, attrs = "Flatten", dict(start_dim=a.get("axis", 1), end_dim=-1)
        elif op == "BatchNormalization":
            ins = [ins[0], ins[3], ins[4], ins[1], ins[2]]
            k, attrs = "BatchNorm", dict(epsilon=a.get("epsilon", 1e-5))
        else:
            raise SystemExit(f"benchmark walker: no mapping for ONNX {op}")
        steps.append((KERNELS[k], attrs, ins, list(node.output)))
    return consts, steps


def _fuse(consts, steps):
    """The TOP canonicalizations that matter for speed, done on the walker's plan: a zero Pad
    merged into the next Conv's pads, a per-channel Mul by a constant folded into the Conv
    weights, and Relu / Clip(0, limit) fused into the Conv (do_relu, relu_limit)."""
    uses = {}
    for _, _, ins, _ in steps:
        for i in ins:
            uses[i] = uses.get(i, 0) + 1
    producer = {}
    out = []
    for kernel, attrs, ins, outs in steps:
        src = producer.get(ins[0]) if ins and uses.get(ins[0]) == 1 else None
        if src is not None and src[0] is KERNELS["Pad"] and kernel is KERNELS["Conv"]:
            p = src[1]["paddings"]
            if src[1]["mode"] == "constant" and src[1]["val"] == 0 and not any(
                    p[i] for i in (0, 1, 4, 5)) and min(p) >= 0:
                base = attrs.get("pads") or [0, 0, 0, 0]
                attrs = dict(attrs, pads=[base[0] + p[2], base[1] + p[3], base[2] + p[6],
                                          base[3] + p[7]])
                ins = [src[2][0]] + ins[1:]
                out.remove(src)
        elif src is not None and src[0] is KERNELS["Conv"] and not src[1].get("do_relu"):
            conv_attrs, conv_ins = src[1], src[2]
            if kernel is KERNELS["Mul"] and ins[1] in consts:
                scale = consts[ins[1]]
                o = consts[conv_ins[1]].shape[0]
                if scale.size == o and scale.shape[-2:] in ((1, 1), (o,)):
                    w = consts[conv_ins[1]] * scale.reshape(o, 1, 1, 1)
                    b = consts.get(conv_ins[2], np.zeros(o, np.float32)) * scale.reshape(o)
                    wn, bn = conv_ins[1] + "/scaled", (conv_ins[2] or outs[0]) + "/scaled"
                    consts[wn], consts[bn] = w.astype(np.float32), b.astype(np.float32)
                    out.remove(src)
                    kernel, attrs, ins = src[0], conv_attrs, [conv_ins[0], wn, bn]
            elif kernel in (KERNELS["Relu"], KERNELS["Clip"]):
                lo, hi = (attrs.get("min"), attrs.get("max")) if kernel is KERNELS["Clip"] \
                    else (0.0, None)
                if lo == 0.0:
                    out.remove(src)
                    kernel, ins = src[0], conv_ins
                    attrs = dict(conv_attrs, do_relu=True, relu_limit=-1.0 if hi is None else hi)
        step = (kernel, attrs, ins, outs)
        out.append(step)
        for o in outs:
            producer[o] = step
    return out


def _walk(consts, steps, feeds):
    env = dict(consts)
    env.update(feeds)
    env[""] = None
    for kernel, attrs, ins, outs in steps:
        for name, value in zip(outs, kernel([env[i] for i in ins], attrs)):
            env[name] = value
    return env


def bench_model(path, repeat):
    """Whole-model throughput of the kernels against onnxruntime on one ONNX CNN."""
    model = onnx.load(path)
    consts, steps = _plan(model)
    steps = _fuse(consts, steps)
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32)
    sess = ort.InferenceSession(path, ort_options(), providers=["CPUExecutionProvider"])
    out_name = sess.get_outputs()[0].name
    want = sess.run(None, {inp.name: x})[0]
    got = _walk(consts, steps, {inp.name: x})[out_name]
    cos = float(np.dot(want.ravel(), got.ravel()) /
                (np.linalg.norm(want) * np.linalg.norm(got)))
    t_ort, t_top = [], []
    for _ in range(repeat):  # interleaved, so both see the same machine load
        t = time.perf_counter()
        sess.run(None, {inp.name: x})
        t_ort.append(time.perf_counter() - t)
        t = time.perf_counter()
        _walk(consts, steps, {inp.name: x})
        t_top.append(time.perf_counter() - t)
    # CPU time per inference: the work each side does, steadier than wall time on a shared
    # machine (onnxruntime's spin-waiting switched off so it is not billed for idling)
    so = ort_options()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    quiet = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    quiet.run(None, {inp.name: x})
    c = time.process_time()
    for _ in range(repeat):
        quiet.run(None, {inp.name: x})
    c_ort = (time.process_time() - c) / repeat
    c = time.process_time()
    for _ in range(repeat):
        _walk(consts, steps, {inp.name: x})
    c_top = (time.process_time() - c) / repeat
    mo, mt = statistics.median(t_ort), statistics.median(t_top)
    print(f"{path}: {len(model.graph.node)} ONNX nodes -> {len(steps)} kernel calls, cosine vs "
          f"ORT {cos:.7f}; median ORT {mo * 1e3:.1f} ms, TOP kernels {mt * 1e3:.1f} ms; throughput ratio TOP/ORT {mo / mt:.2f} "
          f"(best-of: {min(t_ort) / min(t_top):.2f}); CPU per inference ORT {c_ort * 1e3:.1f} ms, "
          f"TOP {c_top * 1e3:.1f} ms, CPU-work ratio ORT/TOP {c_ort / c_top:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", default="", help="run only rows whose label contains this")
    ap.add_argument("--model", action="append", default=[],
                    help="time a whole ONNX CNN instead of the per-op table (repeatable)")
    args = ap.parse_args()
    if args.model:
        for path in args.model:
            bench_model(path, args.repeat)
        return
    print(f"{'op':34s} {'count':>5s} {'ORT ms':>8s} {'TOP ms':>8s} {'ORT/TOP':>8s}")
    totals = {"resnet": [0.0, 0.0], "mobilenet": [0.0, 0.0]}
    for label, count, (onnx_op, x, consts, oattrs, kind, operands, attrs) in cases():
        if args.only and args.only not in label:
            continue
        sess = _session(onnx_op, x, consts, oattrs)
        feed = {"x": x}
        t_ort = _median_time(lambda: sess.run(None, feed), args.repeat)
        ops = [x] + [c if o is None and kind != "Add" else c for c, o in
                     zip(consts, operands)] if kind != "Resize" else [x]
        if kind == "Add":
            ops = [x, consts[0]]
        if kind == "Conv" and len(ops) == 2:
            ops.append(None)
        want = sess.run(None, feed)[0]
        got = KERNELS[kind](ops, attrs)[0]
        if kind == "Conv" and attrs.get("do_relu") or kind == "Add":
            want = np.maximum(want, 0)
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        t_top = _median_time(lambda: KERNELS[kind](ops, attrs), args.repeat)
        net = "resnet" if label.startswith("resnet") else "mobilenet"
        totals[net][0] += count * t_ort
        totals[net][1] += count * t_top
        flag = "" if err < 1e-4 else f"  MISMATCH rel err {err:.1e}"
        print(f"{label:34s} {count:5d} {t_ort * 1e3:8.3f} {t_top * 1e3:8.3f} "
              f"{t_ort / t_top:8.2f}{flag}")
    for net, (t_ort, t_top) in totals.items():
        if t_top:
            print(f"{net + ' weighted total':34s} {'':5s} {t_ort * 1e3:8.2f} {t_top * 1e3:8.2f} "
                  f"{t_ort / t_top:8.2f}")


if __name__ == "__main__":
    main()
