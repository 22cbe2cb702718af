"""The end-to-end job `tftpu-demo` runs on the bundled default model and photo.

On the resnet18-like reference model (the topology PEERS.md measures TPU-MLIR on) and the
bundled photo it shows each of tftpu's jobs, checking every result against the program it
replaces:

1. space-to-depth of the stem through `tftpu.optimize` (target tpu applies, cpu declines);
2. import into the TOP dialect (tf2onnx -> ONNX -> TOP, canonicalized), every shared tensor
   compared with onnxruntime;
3. INT8 calibration of the TOP model (mse thresholds) on views of the photo, and how close
   simulated INT8 stays to float;
4. lowering to the TPU dialect for the npu1 chip in INT8, run with integer arithmetic and
   compared with TOP;
5. the backend: space-to-depth of the stem on TOP (the host makes the S2D input), layer groups,
   DDR plan and codegen to a `.tpumodel`, run by the simulated chip and compared with TPU
   inference bit for bit; estimated latency with and without S2D, and its timeline;
6. ConvertLayout to NHWC: the transposes tf2onnx left are gone, outputs unchanged;
7. target-aware conversion of the TFLite form of the model across GPU and CPU.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import numpy as np


class _Steps:
    """Numbered, timed progress lines."""

    def __init__(self, total: int, log):
        self.total, self.done, self.log = total, 0, log
        self.t = time.perf_counter()

    def __call__(self, message: str) -> None:
        self.done += 1
        now = time.perf_counter()
        self.log(f"[{self.done}/{self.total}] {message} ({now - self.t:.1f} s)")
        self.t = now


def _cosine(a, b) -> float:
    from tftpu.interp.similarity import cosine_similarity

    return float(cosine_similarity(np.asarray(a), np.asarray(b)))


def _compute_ops(model) -> int:
    """Ops that compute (not Input/Weight/None)."""
    return sum(op.name not in ("top.Input", "top.Weight", "top.None") for op in model.ops)


def run(output_dir: str | Path, image_size: int = 224, log=print) -> dict:
    """Run the demo pipeline, writing its artefacts to `output_dir`; return a summary dict."""
    import tensorflow as tf

    from tftpu import frontend, models, quant, tac
    from tftpu.pipelines.optimize import optimize
    from tftpu.frontend.check import compare, onnx_tensors
    from tftpu.interp.top_interpreter import run as run_top
    from tftpu.transforms.canonicalize import canonicalize
    from tftpu.pipelines.deploy import deploy
    from tftpu.transforms.convert_layout import convert_layout
    from tftpu.utils import files

    output_dir = Path(output_dir)
    step = _Steps(8, log)
    summary: dict = {}

    model = models.resnet18_like((image_size, image_size, 3))
    x = models.sample_image(image_size)[None].astype(np.float32) / 127.5 - 1.0
    expected = model(x, training=False).numpy()
    step(f"built {model.name} ({model.count_params():,} parameters) and read the bundled photo {x.shape}")

    serve = tf.function(lambda image: model(image, training=False))
    s2d = optimize(serve, x, target="tpu")
    declined = optimize(serve, x, target="cpu")
    s2d_err = float(np.abs(s2d(x).numpy() - expected).max())
    applied = len(s2d.report["space_to_depth"].changed)
    files.write_text(output_dir / "space_to_depth_report.txt",
                     f"target tpu:\n{s2d.report}\n\ntarget cpu:\n{declined.report}\n")
    step(f"space-to-depth: {applied} conv rewritten for tpu, "
         f"{len(declined.report['space_to_depth'].changed)} for cpu (see space_to_depth_report.txt); "
         f"rewritten vs original max |diff| {s2d_err:.1e}")
    summary.update(s2d_applied=applied, s2d_max_abs_diff=s2d_err)

    proto = frontend.to_onnx(model, [[1, image_size, image_size, 3]])
    files.write_bytes(output_dir / f"{model.name}.onnx", proto.SerializeToString())
    top = frontend.onnx_to_top(proto, model.name)
    n_imported = _compute_ops(top)
    canonicalize(top)
    mlir, _ = top.save(output_dir / f"{model.name}.top.mlir")
    got = run_top(top, {"image": x}, dump_all=True)
    result = compare(onnx_tensors(proto, {"image": x}), got)
    worst = min(result.rows, key=lambda r: r.cosine)
    top_cos = _cosine(got[top.output_names[0]], expected)
    step(f"TOP: {len(proto.graph.node)} ONNX nodes -> {n_imported} ops imported -> {_compute_ops(top)} after "
         f"canonicalize; {len(result.rows)} tensors vs onnxruntime, min cosine {worst.cosine:.7f}; "
         f"output vs Keras cosine {top_cos:.7f}; wrote {mlir.name}")
    summary.update(onnx_nodes=len(proto.graph.node), top_ops=_compute_ops(top), top_min_cosine=worst.cosine,
                   cosine=top_cos, passed=result.passed)

    views = [x, x[:, :, ::-1], np.roll(x, image_size // 8, axis=1), np.roll(x, -image_size // 8, axis=2)]
    samples = [{"image": np.ascontiguousarray(v)} for v in views]  # the photo, mirrored and shifted
    table = quant.calibrate(top, samples, "mse")
    table.save(output_dir / f"{model.name}_cali_table")
    int8 = quant.evaluate(top, table, samples)
    int8_cos, int8_snr = int8.rows[top.output_names[0]]
    step(f"INT8 calibration (mse, {len(samples)} views of the photo): {len(table.entries)} tensors; "
         f"simulated INT8 vs float: cosine {int8_cos:.5f}, SQNR {int8_snr:.1f} dB; "
         f"wrote {model.name}_cali_table")
    summary.update(int8_cosine=int8_cos, int8_sqnr=int8_snr)

    deployed = deploy(top, quantize="INT8", chip="npu1", calibration_table=table, test_input={"image": x},
                      samples=samples[1:], tpu_mlir=output_dir / f"{model.name}_npu1_int8.tpu.mlir")
    out = deployed.outputs[0]
    step(f"TPU dialect for npu1 in INT8 ({', '.join(f'{n} {m}' for m, n in sorted(deployed.lowering.counts().items()))} "
         f"ops): integer inference vs TOP on {1 + len(samples[1:])} views: cosine {out.cosine:.5f}, "
         f"SQNR {out.sqnr:.1f} dB; wrote {deployed.mlir.name}")
    summary.update(tpu_int8_cosine=out.cosine, tpu_int8_sqnr=out.sqnr, tpu_passed=deployed.passed)

    compiled = deploy(top, quantize="INT8", chip="npu1", calibration_table=table, test_input={"image": x},
                      samples=samples[1:], space_to_depth=True, model=output_dir / f"{model.name}_npu1_int8.tpumodel",
                      trace=output_dir / f"{model.name}_npu1_int8.trace.json",
                      report=output_dir / f"{model.name}_npu1_int8_deploy.html")
    prog, sim, stem = compiled.program, compiled.simulator, compiled.s2d or {}
    with_s2d, without = compiled.profile.latency_us, deployed.profile.latency_us
    exact = all(r["bit_exact"] for r in sim["outputs"])
    stem_line = (f"S2D stem {stem['before']:,} -> {stem['after']:,} cycles" if stem.get("applied") and stem.get("before")
                 else "S2D declined")
    step(f"model file for npu1: {stem_line}, the host makes the S2D input; {len(prog.groups.local_groups)} layer "
         f"groups, {len(prog.commands)} commands; simulator vs TPU inference {'bit-exact' if exact else 'DIFFERS'}, "
         f"vs TOP cosine {compiled.outputs[0].cosine:.5f}; estimated latency {with_s2d:,.1f} us with S2D, "
         f"{without:,.1f} us without ({without / with_s2d:.2f}x); wrote {compiled.model_file.name}, "
         f"{compiled.trace.name} (Perfetto), {model.name}_npu1_int8_deploy.html")
    summary.update(sim_passed=sim["passed"], sim_bit_exact=exact, latency_us=with_s2d, latency_us_without_s2d=without,
                   model_passed=compiled.passed)

    layout = convert_layout(top, "NHWC")
    canonicalize(top)
    nhwc_out = run_top(top, {"image": x})[top.output_names[0]]
    nhwc_cos = _cosine(nhwc_out, expected)
    top.save(output_dir / f"{model.name}_nhwc.top.mlir", output_dir / f"{model.name}_nhwc_top_f32_weights.npz")
    step(f"ConvertLayout to NHWC: {layout}; output vs Keras cosine {nhwc_cos:.7f}")
    summary.update(nhwc_cosine=nhwc_cos)

    with contextlib.redirect_stdout(io.StringIO()):  # the converter's Keras export prints its signature
        tflite = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    tac = tac.run(tflite, device_specs=("GPU", "CPU"))
    tac.save(output_dir / f"{model.name}_tac.tflite")
    files.write_text(output_dir / "tac_report.txt", tac.table() + "\n")
    step(f"TAC (GPU,CPU): estimated {tac.cost:.0f} us vs all-CPU {tac.cpu_cost:.0f} us "
         f"({tac.cpu_cost / tac.cost:.2f}x); wrote {model.name}_tac.tflite, tac_report.txt")
    summary.update(tac_speedup=tac.cpu_cost / tac.cost)
    return summary
