"""Two local worker processes against one (issue 23): calibration and evaluation images/s.

    python benchmarks/distributed.py [--images 24] [--workers 2] [--calib 8] [--skip calibrate,evaluate]

The model and images are benchmarks/dataset_scale.py's: PP-OCRv6_det_small at 640x640 and JPEGs
made from the real photos of tftpu.datasets. Printed, in one run:

1. calibration (mse) of `--images` images: one process (`tftpu.quant.calibrate`, the default path)
   against `workers=N` (N processes started by `tftpu.utils.distributed` on loopback), with the
   two tables compared byte for byte;
2. evaluation (`tftpu.evaluate`, the INT8 TPU interpreter against the TOP float interpreter) of the
   same images with a pure-INT8 compile (on `--calib` images): one process against `workers=N`,
   every image's figures compared.

For each: images/s end to end (what a user waits for, the workers' start-up included) and in the
steady state (the chief's job: model load, its share of the images, the merge; that is what grows
with the dataset), and the start-up itself (Python, TensorFlow, the tf.distribute strategy). CPU
seconds (this process's, or the workers' together) and the cores they kept busy on average tell a
loaded machine from a slow path: N workers can only gain where one process leaves cores idle.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset_scale import MEAN, MODEL, SCALE, SIZE, _model, compile_int8, make_images  # noqa: E402


def _cpu(children: bool) -> float:
    """CPU seconds (user + system) so far of this process, or of its waited-for children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Timed:
    """Wall and CPU seconds of a block: this process's CPU, or its children's (the workers')."""

    def __init__(self, children: bool = False):
        self.children = children

    def __enter__(self):
        self.t0, self.c0 = time.perf_counter(), _cpu(self.children)
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t0, _cpu(self.children) - self.c0


def _row(label: str, images: int, t: _Timed, steady: float | None = None, startup: float | None = None) -> str:
    extra = "" if steady is None else f"   steady {images / steady:7.3f} images/s ({steady:6.1f} s), " \
                                      f"start-up {startup:5.1f} s"
    return (f"  {label:22s} {t.wall:7.1f} s  {images / t.wall:7.3f} images/s   CPU {t.cpu:6.1f} s "
            f"({t.cpu / t.wall:.2f} cores){extra}")


def calibration(images: Path, count: int, workers: int, tmp: Path) -> None:
    from tftpu import quant
    from tftpu.utils import distributed

    model = _model()
    with _Timed() as t1:
        one = quant.calibrate(model, quant.iter_samples(model, images, count, MEAN, SCALE, "bgr"), "mse")
    with _Timed(children=True) as tn:
        many = quant.calibrate(model, quant.iter_samples(model, images, count, MEAN, SCALE, "bgr"), "mse",
                               workers=workers)
    one_s, many_s = t1.wall, tn.wall
    run = dict(distributed.LAST_RUN)
    one.save(tmp / "one.txt")
    many.save(tmp / "many.txt")
    same = (tmp / "one.txt").read_bytes() == (tmp / "many.txt").read_bytes()
    print(f"calibration (mse) of {count} images, {len(one.entries)} tensors")
    print(_row("1 process", count, t1))
    print(_row(f"{workers} worker processes", count, tn, run["job_s"], run["startup_s"]))
    print(f"  {workers} workers / 1: {one_s / many_s:.2f}x end to end, {one_s / run['job_s']:.2f}x steady "
          f"(issue 23 target: >= 1.7x with 2); tables byte-identical: {same}\n")


def evaluation(images: Path, count: int, workers: int, calib: int) -> None:
    import tftpu
    from tftpu.utils import distributed

    compiled, compile_s = compile_int8(_model(), images, calib)
    with _Timed() as t1:
        one = tftpu.evaluate(compiled, images, input_num=count, mean=MEAN, scale=SCALE, pixel_format="bgr")
    with _Timed(children=True) as tn:
        many = tftpu.evaluate(compiled, images, input_num=count, mean=MEAN, scale=SCALE, pixel_format="bgr",
                              workers=workers)
    one_s, many_s = t1.wall, tn.wall
    run = dict(distributed.LAST_RUN)
    same = one.images == many.images and all(a.cosine == b.cosine and a.sqnr == b.sqnr
                                             for a, b in zip(one.rows, many.rows))
    print(f"evaluation (INT8 TPU interpreter vs TOP float) of {count} images; compiled pure INT8 on {calib} "
          f"images in {compile_s:.1f} s")
    print(_row("1 process", count, t1) + f"   (its loop {one.images_per_s:.3f} images/s)")
    print(_row(f"{workers} worker processes", count, tn, run["job_s"], run["startup_s"])
          + f"   (chief's loop + gather {many.images_per_s:.3f} images/s)")
    print(f"  {workers} workers / 1: {one_s / many_s:.2f}x end to end, {one_s / run['job_s']:.2f}x steady; "
          f"loops {many.images_per_s / one.images_per_s:.2f}x; every image's figures the same: {same}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=24, help="images calibrated and evaluated")
    ap.add_argument("--workers", type=int, default=2, help="worker processes against one")
    ap.add_argument("--calib", type=int, default=8, help="calibration images of the compile evaluated")
    ap.add_argument("--dir", help="where the generated JPEGs go (kept; default a temporary directory)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: calibrate,evaluate")
    args = ap.parse_args()
    os.environ.setdefault("TFTPU_PROGRESS", "0")
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory(prefix="tftpu_distributed_") as tmp:
        tmp = Path(tmp)
        images = Path(args.dir) if args.dir else tmp / "images"
        images.mkdir(parents=True, exist_ok=True)
        make_images(images, max(args.images, args.calib))
        print(f"{MODEL} at {SIZE}x{SIZE}; {args.images} JPEGs; {args.workers} workers against 1 process; "
              f"cores: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f} (a shared machine: figures are noisy)\n")
        if "calibrate" not in skip:
            calibration(images, args.images, args.workers, tmp)
        if "evaluate" not in skip:
            evaluation(images, args.images, args.workers, args.calib)


if __name__ == "__main__":
    main()
