"""What weight rounding by per-layer reconstruction (`tftpu.quant.weight_rounding`) buys, held out.

    python benchmarks/weight_rounding.py [--models palm_detection_lite.tflite,rnet,...] [--asymmetric auto|0|1]

The same models, samples and two folds as benchmarks/bias_correction.py (calibrate and
reconstruct on half of the samples, judge on the other half, then the other way round). Per
output, the SQNR against the original TOP model pooled over the held-out samples, with the INT8
weights rounded to nearest and by reconstruction:
- weights only: the TOP model with its conv / matmul weights on their INT8 grid, activations float
  (what the rounding itself costs);
- pure INT8: lowered on npu1 (`mixed_precision="none"`), run by the TPU interpreter (exact integer
  arithmetic), without and with bias correction after it;
and the reconstruction's seconds.
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bias_correction import main, model_and_folds  # noqa: E402  (the same models, folds and flags)

SIDES = ("weights only", "pure INT8", "pure INT8 + bias correction")


def measure(name, asymmetric):
    from tftpu import quant
    from tftpu.interp.similarity import sqnr
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.quant.bias_correction import correct_biases
    from tftpu.quant.simulation import quantize_weights
    from tftpu.quant.weight_rounding import reconstruct_rounding
    from tftpu.transforms.lowering import lower

    top, folds = model_and_folds(name)
    ref_run = TopInterpreter(top)
    pooled = {(side, r): {n: ([], []) for n in top.output_names} for side in SIDES for r in ("nearest", "rounded")}
    seconds, report = [], None
    for cal, held in folds:
        table = quant.calibrate(top, cal, "mse", asymmetric=bool(asymmetric))
        t0 = time.perf_counter()
        rounded, report = reconstruct_rounding(top, cal)
        seconds.append(time.perf_counter() - t0)
        refs = [ref_run.run(s) for s in held]
        for key, model in (("nearest", top), ("rounded", rounded)):
            runs = {SIDES[0]: TopInterpreter(quantize_weights(model)),
                    SIDES[1]: TpuInterpreter(lower(model, "npu1", "INT8", table, asymmetric=asymmetric)[0]),
                    SIDES[2]: TpuInterpreter(lower(correct_biases(model, table, cal, asymmetric=asymmetric)[0],
                                                   "npu1", "INT8", table, asymmetric=asymmetric)[0])}
            for side, run in runs.items():
                for s, ref in zip(held, refs):
                    got = run.run(s, dequantize=True) if isinstance(run, TpuInterpreter) else run.run(s)
                    for n in top.output_names:
                        pooled[(side, key)][n][0].append(ref[n].ravel())
                        pooled[(side, key)][n][1].append(got[n].ravel())
    fig = {k: [sqnr(np.concatenate(a), np.concatenate(b)) for a, b in v.values()] for k, v in pooled.items()}
    print(f"{name} (asymmetric={asymmetric}), worst output SQNR dB held out, nearest -> reconstructed; "
          f"reconstruction {np.mean(seconds):.1f} s ({report}):", flush=True)
    for side in SIDES:
        print(f"  {side:28s} {min(fig[(side, 'nearest')]):6.2f} -> {min(fig[(side, 'rounded')]):6.2f}   per output: "
              + ", ".join(f"{a:.2f} -> {b:.2f}" for a, b in zip(fig[(side, 'nearest')], fig[(side, 'rounded')])),
              flush=True)


if __name__ == "__main__":
    main(measure, __doc__)
