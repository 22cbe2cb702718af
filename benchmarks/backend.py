"""The backend against TPU-MLIR's figures in ../shared/PEERS.md: compile time per stage, the
simulator's time (TPU-MLIR's cmodel took 33 s in BF16 and 60 s in F16 on resnet18-like 224:
goal <= 0.2x), and what the backend buys by its own estimate: the first conv and the whole model
with and without S2D (goal: the stem >= 2x faster for ResNet50's 7x7 and MobileNetV2's 3x3 at
batch 1), layer groups against one op per group, and DDR peak against its lower bound.

    python benchmarks/backend.py [--models resnet18_like,ResNet50,MobileNetV2] [--size 224]
        [--modes INT8,BF16,F16] [--chip npu1]

Every compile goes through `tftpu.compile` on the Keras model (random weights; 4 views of the
bundled photo as calibration data), so the times are the whole path a user runs.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

# TPU-MLIR 1.30.2 on resnet18-like 224 (PEERS.md), seconds: model_deploy's cmodel run, and its
# whole path (model_transform 7.5 s + run_calibration 9.1 s for INT8 + model_deploy)
CMODEL_SECONDS = {"BF16": 33.0, "F16": 60.0}
PATH_SECONDS = {"INT8": 7.5 + 9.1 + 6.7, "BF16": 7.5 + 37.1, "F16": 7.5 + 63.7}


def keras_model(name: str, size: int):
    import keras

    from tftpu import models
    if name == "resnet18_like":
        return models.resnet18_like((size, size, 3))
    return getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18_like,ResNet50,MobileNetV2")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--modes", default="INT8,BF16,F16")
    ap.add_argument("--chip", default="npu1")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tftpu
    from tftpu.backend.simulator import Simulator

    x = tftpu.models.sample_image(args.size)[None] / np.float32(127.5) - 1
    views = [x, x[:, :, ::-1], np.roll(x, args.size // 8, axis=1), np.roll(x, -args.size // 8, axis=2)]
    for name in args.models.split(","):
        model = keras_model(name, args.size)
        for mode in args.modes.split(","):
            t0 = time.perf_counter()
            compiled = tftpu.compile(model, chip=args.chip, quantize=mode, calibration_data=views,
                                     mixed_precision="none")
            total = time.perf_counter() - t0
            sim = Simulator(compiled.program)
            t1 = time.perf_counter()
            sim.run({compiled.input_names[0]: x})
            sim_s = time.perf_counter() - t1
            r = compiled.report
            stages = ", ".join(f"{s.name} {s.seconds:.1f} s" for s in compiled.stages)
            print(f"{name} {mode} on {args.chip}: compile {total:.1f} s ({stages})", flush=True)
            peer = ""
            if name == "resnet18_like" and args.size == 224:
                if mode in CMODEL_SECONDS:
                    peer = f"; TPU-MLIR cmodel {CMODEL_SECONDS[mode]:.0f} s -> {sim_s / CMODEL_SECONDS[mode]:.3f}x"
                peer += (f"; whole compile vs TPU-MLIR's transform + calibrate + deploy {PATH_SECONDS[mode]:.1f} s: "
                         f"{total / PATH_SECONDS[mode]:.2f}x")
            print(f"    simulator {sim_s:.2f} s for {len(compiled.program.commands):,} commands{peer}", flush=True)
            groups = compiled.program.groups
            mem = r["memory"]
            print(f"    estimated {r['latency_us']:,.1f} us, utilisation {100 * r['utilisation']:.1f}%; layer groups "
                  f"{groups.cycles:,} cycles vs one op per group {groups.single_cycles:,} "
                  f"({groups.single_cycles / max(groups.cycles, 1):.2f}x); DDR peak {mem['peak']:,} B, lower bound "
                  f"{mem['lower_bound']:,} B", flush=True)
            s2d = r["s2d"]
            if s2d.get("first_conv_cycles"):
                before, after = s2d["first_conv_cycles"]
                whole = r.get("latency_us_without_s2d")
                print(f"    S2D {'applied' if s2d['applied'] else 'declined'}: first conv {before:,} -> {after:,} cycles "
                      f"({before / max(after, 1):.2f}x); whole model {whole:,.1f} -> {r['latency_us']:,.1f} us "
                      f"({whole / r['latency_us']:.2f}x)" if whole else f"    S2D: {s2d}", flush=True)
            else:
                print(f"    S2D: {s2d.get('reason') or 'no strided stem'}", flush=True)


if __name__ == "__main__":
    main()
