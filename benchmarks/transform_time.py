"""Wall time of ONNX -> TOP import + canonicalize + verify, against TPU-MLIR's model_transform.

    python benchmarks/transform_time.py

Models: "resnet18-like" exactly as PEERS.md describes it (7x7/2 conv + BN + ReLU, 3x3/2 max pool,
4 stages of 2 basic blocks 64/128/256/512, 1x1/2 conv + BN downsample, GAP, flatten, Gemm
512->1000, He-normal weights, BN kept as nodes, opset 13, [1,3,224,224]) and keras.applications
ResNet50 (weights=None) through tf2onnx. For resnet18-like it also times the full check
(onnxruntime and TOP on every shared tensor), which is what TPU-MLIR's 7.5 s includes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PEER_S = 7.5  # TPU-MLIR 1.30.2 model_transform on resnet18-like, PEERS.md


def resnet18_like():
    """The peer's ONNX model: ResNet-18 topology with separate BatchNormalization nodes."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    count = [0]

    def name(p):
        count[0] += 1
        return f"{p}{count[0]}"

    def const(arr, p):
        n = name(p)
        inits.append(numpy_helper.from_array(arr.astype(np.float32), n))
        return n

    def conv_bn(x, c_in, c_out, k, s, relu=True):
        w = const(rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2.0 / (c_in * k * k)), "w")
        y = name("conv")
        nodes.append(helper.make_node("Conv", [x, w], [y], kernel_shape=[k, k], strides=[s, s],
                                      pads=[k // 2] * 4))
        bn = [const(rng.uniform(0.5, 1.5, c_out), "g"), const(rng.standard_normal(c_out) * 0.1, "b"),
              const(rng.standard_normal(c_out) * 0.1, "m"), const(rng.uniform(0.5, 1.5, c_out), "v")]
        z = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [y, *bn], [z]))
        if relu:
            r = name("relu")
            nodes.append(helper.make_node("Relu", [z], [r]))
            return r
        return z

    x = conv_bn("input", 3, 64, 7, 2)
    p = name("pool")
    nodes.append(helper.make_node("MaxPool", [x], [p], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, c = p, 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            s = 2 if stage > 0 and block == 0 else 1
            y = conv_bn(x, c, width, 3, s)
            y = conv_bn(y, width, width, 3, 1, relu=False)
            short = conv_bn(x, c, width, 1, s, relu=False) if (s != 1 or c != width) else x
            a, r = name("add"), name("relu")
            nodes += [helper.make_node("Add", [y, short], [a]), helper.make_node("Relu", [a], [r])]
            x, c = r, width
    g, f = name("gap"), name("flat")
    nodes += [helper.make_node("GlobalAveragePool", [x], [g]), helper.make_node("Flatten", [g], [f])]
    fc_w = const(rng.standard_normal((1000, 512)) * np.sqrt(1.0 / 512), "fc_w")
    fc_b = const(np.zeros(1000), "fc_b")
    nodes.append(helper.make_node("Gemm", [f, fc_w, fc_b], ["output"], transB=1))
    graph = helper.make_graph(nodes, "resnet18_like",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def transform(proto, name):
    """import + canonicalize + verify; returns (seconds, onnx nodes, top ops)."""
    from tftpu.frontend.onnx_to_top import onnx_to_top
    from tftpu.transforms.canonicalize import canonicalize
    t0 = time.perf_counter()
    model = onnx_to_top(proto, name)
    canonicalize(model)   # verifies at the end
    dt = time.perf_counter() - t0
    n_ops = sum(1 for op in model.ops if op.op_name not in ("Weight", "None", "Input"))
    return dt, len(proto.graph.node), n_ops, model


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tftpu.frontend.check import compare, onnx_tensors
    from tftpu.interp.top_interpreter import run

    proto = resnet18_like()
    dt, n_nodes, n_ops, model = transform(proto, "resnet18_like")
    print(f"resnet18-like: {n_nodes} ONNX nodes -> {n_ops} TOP ops (TPU-MLIR: 69 -> 32)")
    print(f"  import + canonicalize + verify: {dt:.2f} s")
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    t0 = time.perf_counter()
    result = compare(onnx_tensors(proto, {"input": x}), run(model, {"input": x}, dump_all=True))
    check = time.perf_counter() - t0
    worst = min(result.rows, key=lambda r: r.cosine)
    print(f"  check of all {len(result.rows)} shared tensors vs onnxruntime: {check:.2f} s (TF kernels' first "
          f"load included); min cosine {worst.cosine:.6f}, min euclid {min(r.euclid for r in result.rows):.6f}")
    with tempfile.TemporaryDirectory() as d:
        import onnx
        onnx.save(proto, f"{d}/r18.onnx")
        np.savez(f"{d}/in.npz", input=x)
        tool = Path(__file__).resolve().parents[1] / "tools" / "tftpu_transform.py"
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, str(tool), "--model_name=resnet18_like", f"--model_def={d}/r18.onnx",
                               "--input_shapes=[[1,3,224,224]]", f"--test_input={d}/in.npz",
                               f"--test_result={d}/out.npz", f"--mlir={d}/r18.top.mlir"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
    print(f"  tftpu-transform with --test_input, whole process: {wall:.2f} s (exit {done.returncode}); "
          f"TPU-MLIR model_transform: {PEER_S:.1f} s -> ratio {PEER_S / wall:.2f}x")

    import keras

    from tftpu import frontend
    km = keras.applications.ResNet50(weights=None)
    t0 = time.perf_counter()
    rproto = frontend.to_onnx(km)
    export = time.perf_counter() - t0
    dt, n_nodes, n_ops, _ = transform(rproto, "resnet50")
    print(f"ResNet50 (tf2onnx export {export:.1f} s, not counted): {n_nodes} ONNX nodes -> {n_ops} TOP ops; "
          f"import + canonicalize + verify {dt:.2f} s")


if __name__ == "__main__":
    main()
