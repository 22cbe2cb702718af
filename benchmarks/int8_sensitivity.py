"""Where does a detector's INT8 loss come from? Each tensor, and each conv's weights, put alone on
the grid the INT8 lowering gives it, the rest of the model in float: the outputs' worst SQNR on
the held-out photo.

    python benchmarks/int8_sensitivity.py [--models text_v4,palm_full] [--calib 20] [--top 25]

Each model of `benchmarks/detectors.py` is calibrated (mse, asymmetric) on its photos; TOP then
runs the held-out photo once per tensor of the table with that one tensor rounded to its grid
(`tftpu.quant.params.activation`, or its 16-bit link's grid from `tftpu.quant.links.wide_grids`
where the lowering gives it one) and once per Conv / Deconv / MatMul with its weights alone on
their per-channel INT8 grid (as the lowering rounds them). Printed: the `--top` most damaging, and
three totals: every tensor on its grid (weights float), every weight on its grid (activations
float), both (the fake-quant simulation of pure INT8 before any correction). Noise that a single
rounding makes at the outputs is what the mixed-precision search, the 16-bit links and the
weight corrections can take back one by one; a model whose outputs lose 20 dB and more to one
tensor's rounding (PP-OCRv4's text detector) amplifies noise through its whole backbone.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import detectors as D  # noqa: E402  (benchmarks/detectors.py: models, photos, preprocessing)
from int8_simulation import weights_on_grid  # noqa: E402

from tftpu import datasets, frontend, quant  # noqa: E402
from tftpu.interp.similarity import sqnr  # noqa: E402
from tftpu.interp.top_interpreter import TopInterpreter  # noqa: E402
from tftpu.ir import top  # noqa: E402
from tftpu.ir.module import TopModel, value_name  # noqa: E402
from tftpu.quant import params as P  # noqa: E402
from tftpu.quant.bias_correction import _fake_quant, _quantized_weight  # noqa: E402
from tftpu.quant.links import wide_grids  # noqa: E402

ASYMMETRIC = "auto"      # tftpu.compile's default


def analyse(key: str, calib_count: int, top_n: int) -> None:
    file, size, layout, prep, held, shapes = D.MODELS[key]
    model = frontend.load(frontend.to_onnx(str(datasets.get(file)), shapes), shapes)

    def photo(name, mirror=False):
        img = datasets.image(name, size)
        return {model.input_names[0]: D.preprocess(img[:, ::-1] if mirror else img, layout, prep)}

    calib = [photo(p, m) for p, m in D.photo_set(held, calib_count)]
    x = photo(held)
    table = quant.calibrate(model, calib, "mse", asymmetric=True)
    grids = {n: P.activation(*e[:3], asymmetric=ASYMMETRIC) for n, e in table.entries.items()}
    links = wide_grids(model, table, ASYMMETRIC, lambda name: True)
    grids.update(links)
    outputs = model.output_names
    flt = TopInterpreter(model).run(x)
    ref = {o: flt[o].astype(np.float64) for o in outputs}

    def worst(interp, only=None):
        def observe(name, a):
            on = name in grids and (only is None or name == only) and a.dtype.kind == "f"
            return _fake_quant(a, grids[name]) if on else a
        y = interp.run(x, observe=observe if only != "" else None)
        return min(sqnr(ref[o], y[o].astype(np.float64)) for o in outputs)

    t0 = time.perf_counter()
    interp = TopInterpreter(model)
    rows = [(worst(interp, name), "tensor", name + (" (16-bit link)" if name in links else "")) for name in grids]
    for op in model.ops:
        if isinstance(op, (top.Conv, top.Deconv, top.MatMul)) and isinstance(op.operands[1].owner, top.Weight):
            k = op.operands[1].owner.key
            q = _quantized_weight(op, np.asarray(model.weights[k]))
            if q is not None:
                alone = TopModel(model.module, dict(model.weights))
                alone.weights[k] = q
                rows.append((worst(TopInterpreter(alone), ""), "weights", f"{op.name} {value_name(op.results[0])}"))
    rows.sort(key=lambda r: r[0])
    on_grid = TopInterpreter(weights_on_grid(model))
    totals = (worst(interp), worst(on_grid, ""), worst(on_grid))
    print(f"== {key}: {file}, held out {held}, {len(calib)} calibration photos, {len(grids)} tensors "
          f"({len(links)} on 16-bit links), {len(rows) - len(grids)} weighted ops; {time.perf_counter() - t0:.0f} s")
    print(f"  worst output SQNR: every tensor on its grid {totals[0]:.2f} dB, every weight {totals[1]:.2f} dB, "
          f"both {totals[2]:.2f} dB")
    print(f"  the {top_n} single roundings that cost the outputs most (worst output SQNR, dB):")
    for db, kind, name in rows[:top_n]:
        print(f"  {db:8.2f}  {kind:8s} {name[-90:]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="text_v4,palm_full", help=f"of {', '.join(D.MODELS)}")
    parser.add_argument("--calib", type=int, default=20, help="calibration photos (detectors.py's --calib)")
    parser.add_argument("--top", type=int, default=25, help="rows printed per model")
    args = parser.parse_args(argv)
    for key in args.models.split(","):
        if key not in D.MODELS:
            parser.error(f"--models: unknown model {key!r} (one of {', '.join(D.MODELS)})")
        analyse(key, args.calib, args.top)


if __name__ == "__main__":
    main()
