"""Does the INT8 lowering lose more than its grids do? The real INT8 program against an ideal
fake-quant simulation on the same grids, tensor by tensor, on a detector's held-out photo.

    python benchmarks/int8_simulation.py [--models palm_full,face] [--calib 20] [--all]

Each model of `benchmarks/detectors.py` is calibrated (mse) on its photos and lowered to pure
INT8 on npu1 (`mixed_precision="none"`, no weight refit or bias correction, no space-to-depth),
then run on the held-out photo three ways: float TOP; the TPU interpreter (exact integer
arithmetic, dequantized); and TOP with every weight of a Conv / Deconv / MatMul on its INT8 grid
(as the lowering quantizes it) and every tensor the table names rounded to the grid the lowering
gives it (`tftpu.quant.params.activation`, the 16-bit links of `tftpu.quant.links.wide_grids`
without split links: a tensor that a conv reads beside an Add is simulated on its 8-bit grid for
both, so the simulation is a little worse than the program there). That simulation is what bias
correction and weight refit fit to.

Per tensor (in model order with `--all`, else a summary): SQNR of the program and of the
simulation against float, and of one against the other. Where the program is well under the
simulation, the integer kernels (requantization, tables, the element-wise rules) lose more than
rounding to the grids does; where both fall together, the loss is the grids' own (a tensor of a
few values, an SE block's pooled vector, differs either way by chance: look at what follows it).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import detectors as D  # noqa: E402  (benchmarks/detectors.py: models, photos, preprocessing)

from tftpu import datasets, frontend, quant  # noqa: E402
from tftpu.interp.similarity import sqnr  # noqa: E402
from tftpu.interp.top_interpreter import TopInterpreter  # noqa: E402
from tftpu.interp.tpu import TpuInterpreter  # noqa: E402
from tftpu.ir import top  # noqa: E402
from tftpu.ir.module import TopModel, parse_module, value_name  # noqa: E402
from tftpu.pipelines.deploy import deploy  # noqa: E402
from tftpu.quant import params as P  # noqa: E402
from tftpu.quant.bias_correction import _fake_quant, _quantized_weight  # noqa: E402
from tftpu.quant.links import wide_grids  # noqa: E402

ASYMMETRIC = "auto"      # tftpu.compile's default


def weights_on_grid(model: TopModel) -> TopModel:
    """A copy of `model` whose Conv / Deconv / MatMul weights are their INT8 values (as floats), as
    the lowering rounds them (`tftpu.quant.simulation.quantize_weights` rounds half to even and
    leaves Deconv alone)."""
    copy = TopModel(parse_module(model.text()), dict(model.weights))
    for op in copy.ops:
        if isinstance(op, (top.Conv, top.Deconv, top.MatMul)) and isinstance(op.operands[1].owner, top.Weight):
            key = op.operands[1].owner.key
            q = _quantized_weight(op, np.asarray(copy.weights[key]))
            if q is not None:
                copy.weights[key] = q
    return copy


def compare(key: str, calib_count: int, show_all: bool) -> None:
    file, size, layout, prep, held, shapes = D.MODELS[key]
    proto = frontend.to_onnx(str(datasets.get(file)), shapes)
    model = frontend.load(proto, shapes)

    def photo(name, mirror=False):
        img = datasets.image(name, size)
        return {model.input_names[0]: D.preprocess(img[:, ::-1] if mirror else img, layout, prep)}

    calib = [photo(p, m) for p, m in D.photo_set(held, calib_count)]
    x = photo(held)
    table = quant.calibrate(model, calib, "mse", asymmetric=True)
    program = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, asymmetric=ASYMMETRIC,
                     mixed_precision="none", space_to_depth=False).model
    grids = {n: P.activation(*e[:3], asymmetric=ASYMMETRIC) for n, e in table.entries.items()}
    grids.update(wide_grids(model, table, ASYMMETRIC, lambda name: True, split=False))

    def on_grid(name, a):
        return _fake_quant(a, grids[name]) if name in grids and a.dtype.kind == "f" else a

    real = TpuInterpreter(program).run(x, dump_all=True, dequantize=True)
    flt = TopInterpreter(model).run(x, dump_all=True)
    sim = TopInterpreter(weights_on_grid(model)).run(x, dump_all=True, observe=on_grid)
    op_of = {value_name(r): op for op in model.ops for r in op.results}
    rows = []
    for name, f in flt.items():
        if name not in real or name not in sim or f.dtype.kind != "f" or f.size < 2:
            continue
        f = f.astype(np.float64)
        rows.append((name, op_of[name].name, sqnr(f, real[name].astype(np.float64)),
                     sqnr(f, sim[name].astype(np.float64)),
                     sqnr(sim[name].astype(np.float64), real[name].astype(np.float64))))
    print(f"== {key}: {file}, held out {held}, {len(calib)} calibration photos, {len(rows)} tensors")
    print(f"  {'tensor':44s} {'op':14s} {'program':>8s} {'sim':>8s} {'prog/sim':>8s}  (SQNR dB vs float)")
    outputs = set(model.output_names)
    for name, op, a, b, c in rows:
        if show_all or name in outputs:
            print(f"  {name[:44]:44s} {op[4:18]:14s} {a:8.2f} {b:8.2f} {c:8.2f}")
    gaps = [(a - b, n) for n, _, a, b, _ in rows if np.isfinite(a) and np.isfinite(b)]
    worst = min(gaps)
    print(f"  program - simulation: median {np.median([g for g, _ in gaps]):+.2f} dB, worst {worst[0]:+.2f} dB "
          f"at {worst[1]!r}, {sum(g < -1.0 for g, _ in gaps)} tensors more than 1 dB under the simulation")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="palm_full,face", help=f"of {', '.join(D.MODELS)}")
    parser.add_argument("--calib", type=int, default=20, help="calibration photos (detectors.py's --calib)")
    parser.add_argument("--all", action="store_true", help="print every tensor, not only the outputs")
    args = parser.parse_args(argv)
    for key in args.models.split(","):
        if key not in D.MODELS:
            parser.error(f"--models: unknown model {key!r} (one of {', '.join(D.MODELS)})")
        compare(key, args.calib, args.all)


if __name__ == "__main__":
    main()
