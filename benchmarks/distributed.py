"""Two local worker processes against one (issue 23): calibration and evaluation images/s.

    python benchmarks/distributed.py [--images 240] [--workers 2] [--calib 8]
        [--skip ceiling,calibrate,evaluate] [--threads N]

The model and images are benchmarks/dataset_scale.py's: PP-OCRv6_det_small at 640x640 and JPEGs
made from the real photos of tftpu.datasets. Printed, in one run:

0. the machine's ceiling now: the calibration statistics loop in one plain process against N plain
   processes at once on a share of the images each (no tf.distribute, start-up not counted): on a
   machine shared with other jobs, N workers cannot do better than this;
1. calibration (mse) of `--images` images: one process (`tftpu.quant.calibrate`, the default path)
   against `workers=N` (N processes started by `tftpu.utils.distributed` on loopback), with the
   two tables compared byte for byte;
2. evaluation (`tftpu.evaluate`, the INT8 TPU interpreter against the TOP float interpreter) of the
   same images with a pure-INT8 compile (on `--calib` images): one process against `workers=N`,
   every image's figures compared.

For each: images/s end to end (what a user waits for, the workers' start-up included) and in the
steady state (the chief's job: model load, its share of the images, the merge; that is what grows
with the dataset), and the start-up itself (Python, TensorFlow, the tf.distribute strategy), then
the chief's phases (python, tensorflow, cluster, model hand-over or load, its images, the merge). CPU
seconds (this process's, or the workers' together) and the cores they kept busy on average tell a
loaded machine from a slow path: N workers can only gain where one process leaves cores idle.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
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


def _phases(run: dict) -> str:
    """The chief's phases (`tftpu.utils.distributed.LAST_RUN`), seconds each, from its process start."""
    return "  chief's phases: " + ", ".join(f"{name} {sec:.1f} s" for name, sec in run.get("phases", []))


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
    print(f"calibration (mse) of {count} images, {len(one.entries)} tensors; load average now "
          f"{os.getloadavg()[0]:.1f}")
    print(_row("1 process", count, t1))
    print(_row(f"{workers} worker processes", count, tn, run["job_s"], run["startup_s"]))
    print(_phases(run))
    print(f"  {workers} workers / 1: {one_s / many_s:.2f}x end to end, {one_s / run['job_s']:.2f}x steady "
          f"(issue 23 target: >= 1.7x with 2); tables byte-identical: {same}\n")


def child_loop(images: Path, count: int, shard: str) -> None:
    """(child process) The calibration statistics loop alone on shard "k/N" of the images, with no
    tf.distribute: prints its wall seconds (after the model load) as JSON."""
    from tftpu import quant
    from tftpu.quant.calibrate import _collect

    k, n = map(int, shard.split("/"))
    threads = int(os.environ.get("TFTPU_WORKER_THREADS", "0"))
    if threads:                                  # as a worker of `launch` has them
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    model = _model()
    stream = quant.iter_samples(model, images, count, MEAN, SCALE, "bgr").shard(k, n)
    t0 = time.perf_counter()
    _, seen, _ = _collect(model, stream, empty=True)
    print(json.dumps({"images": seen, "loop_s": time.perf_counter() - t0}))


def ceiling(images: Path, count: int, workers: int) -> None:
    """What this machine gives N processes now: the statistics loop of one plain process on all the
    images against N plain processes (no tf.distribute, no start-up counted; the workers' threads)
    on a share each at once."""
    from tftpu.utils import distributed

    def start(shard):
        threads = distributed.default_threads(workers) if not shard.endswith("/1") else 0
        return subprocess.Popen([sys.executable, __file__, "--dir", str(images), "--images", str(count),
                                 "--child-loop", shard], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "TFTPU_WORKER_THREADS": str(threads)})

    def loop_s(procs):
        return max(json.loads(p.communicate()[0].strip().splitlines()[-1])["loop_s"] for p in procs)

    one = loop_s([start("0/1")])
    many = loop_s([start(f"{k}/{workers}") for k in range(workers)])
    print(f"machine ceiling now: the calibration loop on {count} images in 1 plain process {one:.1f} s, in "
          f"{workers} at once {many:.1f} s: {one / many:.2f}x (load average {os.getloadavg()[0]:.1f}); the workers "
          f"cannot beat this\n")


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
          f"images in {compile_s:.1f} s; load average now {os.getloadavg()[0]:.1f}")
    print(_row("1 process", count, t1) + f"   (its loop {one.images_per_s:.3f} images/s)")
    print(_row(f"{workers} worker processes", count, tn, run["job_s"], run["startup_s"])
          + f"   (chief's loop + gather {many.images_per_s:.3f} images/s)")
    print(_phases(run))
    print(f"  {workers} workers / 1: {one_s / many_s:.2f}x end to end, {one_s / run['job_s']:.2f}x steady; "
          f"loops {many.images_per_s / one.images_per_s:.2f}x; every image's figures the same: {same}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=240,
                    help="images calibrated and evaluated (the fixed costs fade after a few hundred)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes against one")
    ap.add_argument("--calib", type=int, default=8, help="calibration images of the compile evaluated")
    ap.add_argument("--dir", help="where the generated JPEGs go (kept; default a temporary directory)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: calibrate,evaluate,ceiling")
    ap.add_argument("--child-loop", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None,
                    help="TensorFlow threads per worker (default: cores / workers; 0: TensorFlow's own count)")
    args = ap.parse_args()
    if args.child_loop:
        return child_loop(Path(args.dir), args.images, args.child_loop)
    if args.threads is not None:
        from tftpu.utils import distributed
        distributed.default_threads = lambda workers: args.threads
    os.environ.setdefault("TFTPU_PROGRESS", "0")
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory(prefix="tftpu_distributed_") as tmp:
        tmp = Path(tmp)
        images = Path(args.dir) if args.dir else tmp / "images"
        images.mkdir(parents=True, exist_ok=True)
        make_images(images, max(args.images, args.calib))
        from tftpu.utils import distributed
        threads = distributed.default_threads(args.workers) or "TensorFlow's own count of"
        print(f"{MODEL} at {SIZE}x{SIZE}; {args.images} JPEGs; {args.workers} workers against 1 process, {threads} "
              f"TensorFlow threads each; cores: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f} "
              f"(a shared machine: figures are noisy)\n")
        if "ceiling" not in skip:
            ceiling(images, args.images, args.workers)
        if "calibrate" not in skip:
            calibration(images, args.images, args.workers, tmp)
        if "evaluate" not in skip:
            evaluation(images, args.images, args.workers, args.calib)


if __name__ == "__main__":
    main()
