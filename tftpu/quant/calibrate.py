"""Calibration: run the TOP model on sample inputs and choose each tensor's INT8 threshold.

One streaming pass over the samples (`TopInterpreter.run(..., observe=...)`, so no sample's
tensors are all kept): per float tensor the min, the max and a signed histogram on a grid
anchored at 0 whose range (a power of two) doubles (adjacent bins merged, exactly) whenever a
sample reaches past it, so the first sample's range needs no second pass. Exact zeros (ReLU's,
padding's) quantize without error and would swamp the first bin, so they are left out, as
TPU-MLIR also does. The grid has 2 x `bins` bins a side, so every tensor gets more than `bins`
bins over [0, largest |x|] (the two-pass `calibrate_two_pass` had exactly `bins`). A method
(`tftpu.quant.thresholds`) then picks the threshold, and with `asymmetric=True` also a clipped
[min, max].

The table does not depend on the CPU's float kernels, which round activations differently in
the last bits (oneDNN, MLAS and Eigen pick code paths per ISA): every number written lies on a
grid (`TensorStatistics`): min and max rounded outward to 1/256 of the tensor's power-of-two
range, thresholds chosen among values of 8 significant bits by bin counts on exact dyadic bins.
Such noise changes a table only where it moves a value across a grid point, or tips a near tie
between candidates (kl's local minima can; `tests/foundation/test_golden.py` checks mse tables
of real models with weights a few ulps off, and with oneDNN held to AVX2).

`method="auto"` judges each tensor's candidates (every method's threshold or range) by what the
tensor feeds, as TPU-MLIR's auto-tune does: on the first `tune_num` samples it fake-quantizes the
tensor alone at each candidate, reruns each consumer op on that, and keeps the candidate whose
consumer outputs lie closest to float (relative squared error; a model output is also judged on
itself). Every tensor is keyed by its location name, so the table lines up with the `.mlir` and
with `tftpu-run` dumps.

>>> table = calibrate(model, samples, method="mse")  # doctest: +SKIP
>>> table.save("resnet_cali_table")                   # doctest: +SKIP
"""

from __future__ import annotations

import collections
import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tftpu.errors import InputError, InternalError, KernelError, TftpuError, UsageError
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir.module import TopModel
from tftpu.quant.dataset import Samples
from tftpu.quant.simulation import fake_quant, fake_quant_asymmetric
from tftpu.quant.table import CalibrationTable
from tftpu.quant.thresholds import CLIP_WEIGHTS, METHODS, asymmetric_range, mse, threshold
from tftpu.utils.progress import progress
from tftpu.utils.threads import pool_size

__all__ = ["calibrate", "calibrate_each", "calibrate_two_pass", "TensorStatistics", "BINS", "TUNE_NUM",
           "AUTO_CANDIDATES", "CALIBRATION_METHODS"]

BINS = 2048
MAX_BINS = 1 << 20         # a histogram of this many bins per tensor stays a few MB
# Every number in a table lies on a grid that last-bit float noise does not move (TensorStatistics):
# min and max rounded outward to 1/EXTREME_STEPS of the tensor's power-of-two range (half an INT8
# level), thresholds chosen among the floats of SIGNIFICANT_BITS significant bits (neighbours under
# 0.8% apart, so within 0.4% of the method's own optimum).
EXTREME_STEPS = 256
SIGNIFICANT_BITS = 8
TUNE_NUM = 5
# The candidates `auto` weighs, in the order that breaks ties (equal thresholds count for the first).
AUTO_CANDIDATES = ("mse", "kl", "percentile", "aciq_gauss", "aciq_laplace", "minmax")
CALIBRATION_METHODS = (*METHODS, "auto")


def _power_of_two_at_least(x: float) -> float:
    """The smallest power of two >= x > 0 (exact: from the float's exponent)."""
    m, e = math.frexp(x)
    return math.ldexp(1.0, e - 1 if m == 0.5 else e)


def significant(x: float, up: bool = False) -> float:
    """`x` rounded (to nearest, or `up` in magnitude) to SIGNIFICANT_BITS significant bits, exactly."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    _, e = math.frexp(abs(x))
    k = math.ldexp(abs(x), SIGNIFICANT_BITS - e)        # in [2^(bits-1), 2^bits): exact
    k = math.ceil(k) if up else round(k)
    return math.copysign(math.ldexp(k, e - SIGNIFICANT_BITS), x) + 0.0


def _short_edges(m: int) -> np.ndarray:
    """Which of the bin edges 1..m (in bins) have at most SIGNIFICANT_BITS significant bits."""
    j = np.arange(1, m + 1)
    drop = np.maximum(np.frexp(j.astype(np.float64))[1] - SIGNIFICANT_BITS, 0)
    return j % (1 << drop) == 0


class TensorStatistics:
    """One tensor's streaming min, max and signed histogram (zeros left out) on a doubling grid.

    Bin k of the 2 x `half` bins covers [(k - half) w, (k - half + 1) w) with w = range / half;
    `range` is a power of two (the smallest at or above the first sample's largest |x|), and
    when a sample reaches past it, pairs of bins merge and the range doubles. With `half` a power
    of two (the default), every bin edge is an exact dyadic number and a value's bin is exact
    (x * half / range scales by a power of two, then floor). The histogram at a given range does
    not depend on the order values came in (a value at exactly +range, kept in the last bin, moves
    to its own bin when the range doubles), so statistics of shards of a dataset `merge` into
    exactly those of the whole (`tftpu.quant.calibrate(..., workers=N)`).

    The float kernels of different CPUs round activations differently in the last bits, so
    nothing written in a table is a raw float: `lo`/`hi` are the observed min/max rounded
    outward to multiples of `step` (range / EXTREME_STEPS), and a threshold is chosen among the
    values of SIGNIFICANT_BITS significant bits (mse searches only those bin edges; percentile
    rounds up to one, kl, ACIQ and the asymmetric ranges to the nearest). Noise then changes a
    table only where it moves a value across one of those grid points, or tips a near tie
    between candidates that lie 2^-8 apart.
    """

    __slots__ = ("half", "vmin", "vmax", "range", "hist", "top")

    def __init__(self, half: int):
        self.half = half
        self.vmin, self.vmax = math.inf, -math.inf
        self.range = 0.0
        self.hist: np.ndarray | None = None
        self.top = 0            # values exactly at +range (in the last bin until the range doubles)

    def add(self, arr: np.ndarray) -> None:
        a = arr.reshape(-1)
        if a.dtype != np.float32 and a.dtype != np.float64:
            a = a.astype(np.float32)
        mn, mx = float(a.min()), float(a.max())
        if not (math.isfinite(mn) and math.isfinite(mx)):
            raise ValueError("non-finite values")
        self.vmin, self.vmax = min(self.vmin, mn), max(self.vmax, mx)
        absmax = max(-mn, mx)
        if absmax == 0:
            return
        n = self.half
        if self.hist is None:
            self.range, self.hist = _power_of_two_at_least(absmax), np.zeros(2 * n, np.int64)
        while absmax > self.range:
            self._double()
        scale = n / self.range                  # a power of two: x * scale is exact
        if a.dtype == np.float32 and not scale < 2.0 ** 127:
            a = a.astype(np.float64)
        t = a * a.dtype.type(scale)
        np.floor(t, out=t)                      # the signed bin index, exact
        idx = t.astype(np.intp)
        idx += n
        counts = np.bincount(idx, minlength=2 * n)
        counts[n] -= a.size - np.count_nonzero(a)   # the exact zeros
        top = int(counts[2 * n:].sum())               # x == +range: counted in the last bin
        counts[2 * n - 1] += top
        self.top += top
        self.hist += counts[:2 * n]

    def _double(self) -> None:
        """Double the range: adjacent bins merge (exact); the values at the old +range, counted in
        the last bin, move to the bin they fall in now, so the histogram at a given range is the
        same whatever the order the values came in (and statistics merge exactly)."""
        n = self.half
        self.hist[2 * n - 1] -= self.top
        merged = self.hist.reshape(n, 2).sum(1)
        self.hist = np.zeros(2 * n, np.int64)
        self.hist[n // 2:n // 2 + n] = merged
        self.hist[n + n // 2] += self.top
        self.top = 0
        self.range *= 2.0

    def grow(self, range_: float) -> None:
        """Widen the grid to `range_` (a power of two at or above the range; no-op without values)."""
        if self.hist is not None:
            while self.range < range_:
                self._double()

    def merge(self, other: "TensorStatistics") -> None:
        """Add `other`'s values (same `half`): the result is exactly the statistics of both
        streams of values, in any order (the grid of the wider widens the other first)."""
        if other.half != self.half:
            raise InternalError(f"merging statistics of {self.half} and {other.half} half-bins")
        self.vmin, self.vmax = min(self.vmin, other.vmin), max(self.vmax, other.vmax)
        if other.hist is None:
            return
        if self.hist is None:
            self.range, self.hist, self.top = other.range, other.hist.copy(), other.top
            return
        self.grow(other.range)
        hist, top = other.hist, other.top
        if other.range < self.range:
            widened = TensorStatistics(other.half)
            widened.range, widened.hist, widened.top = other.range, other.hist.copy(), other.top
            widened.grow(self.range)
            hist, top = widened.hist, widened.top
        self.hist += hist
        self.top += top

    @property
    def width(self) -> float:
        return self.range / self.half

    @property
    def step(self) -> float:
        """The grid of the extremes: 1/256 of the range (a whole number of bins)."""
        return max(1, self.half // EXTREME_STEPS) * self.width

    @property
    def lo(self) -> float:
        """The observed min rounded down to the grid of the extremes (0 stays 0)."""
        if self.hist is None:
            return min(self.vmin, 0.0) + 0.0
        return math.floor(self.vmin / self.step) * self.step + 0.0

    @property
    def hi(self) -> float:
        """The observed max rounded up to the grid of the extremes."""
        if self.hist is None:
            return max(self.vmax, 0.0) + 0.0
        return math.ceil(self.vmax / self.step) * self.step + 0.0

    @property
    def absmax(self) -> float:
        """The largest |x| rounded up to the grid of the extremes."""
        return max(-self.lo, self.hi, 0.0)

    def magnitudes(self) -> tuple[np.ndarray, float]:
        """(|x| histogram over [0, m w], m w) with m w = `absmax`, the largest |x| rounded up."""
        if self.hist is None:
            return np.zeros(1, np.int64), 0.0
        n = self.half
        m = min(n, max(1, round(self.absmax / self.width)))
        return self._signed(0, m) + self.hist[n - 1::-1][:m], m * self.width

    def _signed(self, k0: int, k1: int) -> np.ndarray:
        """The signed bins k0 .. k1 - 1, with the values exactly at k1 w counted in the last (the
        max rounded up to the grid is often the max itself: 6 for ReLU6, 1 for a sigmoid)."""
        n = self.half
        h = self.hist[n + k0:n + k1].copy()
        if 0 < k1 < n:
            h[-1] += self.hist[n + k1]
        return h

    def threshold(self, method: str) -> float:
        hist, extent = self.magnitudes()
        if method in CLIP_WEIGHTS:
            t = mse(hist, extent, candidates=_short_edges(len(hist)), clip_weight=CLIP_WEIGHTS[method])
        else:
            t = significant(threshold(method, hist, extent), up=method == "percentile")
        return min(t, extent)

    def range_of(self, method: str) -> tuple[float, float]:
        """The asymmetric [min, max] of `method` on the signed histogram, SIGNIFICANT_BITS bits each."""
        lo, hi = self.lo, self.hi
        if self.hist is None:
            return lo, hi
        n, w = self.half, self.width
        k0 = min(0, round(lo / w))
        k1 = max(0, round(hi / w))
        a, b = asymmetric_range(method, self._signed(k0, k1), k0 * w, w, lo, hi)
        a, b = max(significant(a), lo), min(significant(b), hi)
        return (a, b) if a <= 0 <= b and a < b else (min(lo, 0.0), max(hi, 0.0))


def _check(method: str, samples, bins: int) -> None:
    if method not in CALIBRATION_METHODS:
        raise UsageError(f"calibration method {method!r}: expected one of {', '.join(CALIBRATION_METHODS)}")
    if isinstance(samples, (list, tuple)) and not samples:
        raise InputError("calibration needs at least one sample input")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 128 < bins <= MAX_BINS:
        raise UsageError(f"bins {bins!r}: use an integer above 128, at most {MAX_BINS:,} (a histogram per tensor)")


def collect(model, samples, bins: int = BINS) -> dict[str, TensorStatistics]:
    """Every float tensor's statistics over `samples`, in model order, from one interpreter pass."""
    return _collect(model, samples, bins)[0]


def _collect(model, samples, bins: int = BINS, keep: int = 0,
             empty: bool = False) -> tuple[dict[str, TensorStatistics], int, list]:
    """(statistics, how many samples, the first `keep` samples): one pass over `samples`, a list
    or any iterable (`tftpu.quant.iter_samples`), taken one sample at a time (none only if `empty`).
    Samples run on the worker threads, a few at a time; each one's statistics are merged into the
    whole in sample order (and would be the same in any: `TensorStatistics.merge`)."""
    interp = TopInterpreter(model)
    stats: dict[str, TensorStatistics] = {}

    def one(where: str, sample) -> dict[str, TensorStatistics]:
        own: dict[str, TensorStatistics] = {}

        def observe(name, arr):
            if arr.dtype.kind == "f" and arr.size:
                st = own.get(name)
                if st is None:
                    st = own[name] = TensorStatistics(2 * bins)
                try:
                    st.add(arr)
                except ValueError:
                    raise InputError(f"{where}: tensor {name!r} has non-finite values (NaN or inf); "
                                     "calibration needs finite inputs") from None
            return arr

        interp.run(sample, observe=observe)
        return own

    def merge(own: dict[str, TensorStatistics]) -> None:
        for name, st in own.items():
            if name in stats:
                stats[name].merge(st)
            else:
                stats[name] = st

    total = len(samples) if isinstance(samples, (list, tuple)) else getattr(samples, "total", None)
    named = samples.items() if isinstance(samples, Samples) else ((f"sample {i}", x) for i, x in enumerate(samples))
    head, count = [], 0
    threads = pool_size()
    workers = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    pending: collections.deque = collections.deque()    # (at most `threads` samples held at once)
    try:
        for count, (where, sample) in enumerate(progress(named, desc="calibration statistics", total=total,
                                                         unit="image"), 1):
            if count <= keep:
                head.append(sample)
            if workers is None:
                merge(one(where, sample))
                continue
            if len(pending) >= threads:
                merge(pending.popleft().result())
            pending.append(workers.submit(one, where, sample))
        while pending:
            merge(pending.popleft().result())
    finally:
        if workers is not None:
            workers.shutdown(cancel_futures=True)
    if count == 0 and not empty:
        raise InputError("calibration needs at least one sample input")
    return stats, count, head


def merge_statistics(stats: dict[str, TensorStatistics], count: int, bins: int,
                     cluster) -> tuple[dict[str, TensorStatistics], int]:
    """Every worker's statistics and sample count merged, on every worker (`cluster`, a
    `tftpu.utils.distributed.Cluster`): the extremes and ranges gathered, each histogram widened to
    the common range, then summed by an int64 all-reduce, so the result is exactly the statistics
    of all the workers' samples in one stream."""
    lists = cluster.gather_json(list(stats))
    names = next((n for n in lists if n), [])
    if any(n and n != names for n in lists):
        raise InternalError("workers saw different tensors of the same model")
    half = 2 * bins
    local = [stats.get(n) or TensorStatistics(half) for n in names]
    extremes = [np.asarray(e, np.float64).reshape(-1, 3) for e in
                cluster.gather_json([[st.vmin, st.vmax, st.range] for st in local])]
    extremes = [e for e in extremes if e.size]
    lo = np.min([e[:, 0] for e in extremes], axis=0) if names else []
    hi = np.max([e[:, 1] for e in extremes], axis=0) if names else []
    ranges = np.max([e[:, 2] for e in extremes], axis=0) if names else []
    hists = np.zeros((len(names), 2 * half + 1), np.int64)      # the last column: values at +range
    for i, st in enumerate(local):
        if st.hist is not None:
            st.grow(float(ranges[i]))
            hists[i, :2 * half], hists[i, 2 * half] = st.hist, st.top
    hists = cluster.all_sum(hists)
    total = int(cluster.all_sum(np.array([count]))[0])
    merged = {}
    for i, name in enumerate(names):
        st = merged[name] = TensorStatistics(half)
        st.vmin, st.vmax = float(lo[i]), float(hi[i])
        if ranges[i] > 0:
            st.range, st.hist, st.top = float(ranges[i]), hists[i, :2 * half].copy(), int(hists[i, 2 * half])
    return merged, total


def calibrate(model, samples, method: str = "mse", bins: int = BINS, asymmetric: bool = False,
              tune_num: int = TUNE_NUM, *, workers: int = 1, cluster=None) -> CalibrationTable:
    """A CalibrationTable for every float tensor of `model` over `samples`: a list of input dicts,
    or any iterable of them read once, one at a time (`tftpu.quant.iter_samples` streams a
    directory, a glob, TFRecords or a tf.data.Dataset with bounded memory; the table is
    byte-identical to the one from the same samples in a list). `auto` keeps its first
    `tune_num` samples to judge candidates on.

    `method` defaults to mse: on mtcnn O-Net with its real weights, kl's thresholds cost 1.5% of
    the face/non-face accuracy in simulated INT8 and mse's none (`benchmarks/calibration_quality.py`).
    With `asymmetric`, each entry's min/max is the method's clipped range for INT8 asymmetric
    mode (the header says so); otherwise the observed min/max. Several methods joined by commas
    ("mse,tail_mse") give the first one's table with the others' as its `alternates` (the same
    statistics), which `tftpu.pipelines.deploy` tries in order where the one before misses.

    `workers=N` spreads the statistics over N worker processes on this machine, and `cluster`
    (`tftpu.utils.distributed.Cluster.from_tf_config()`) over the tf.distribute workers of
    `TF_CONFIG`, this process being one: each runs the model on every N-th sample (`samples` then
    a `tftpu.quant.iter_samples` stream of a path, which each worker reads itself, or, with
    `cluster`, the same list on every worker), the statistics merge exactly, and the table is
    byte-identical to the one-process table (see `tftpu.utils.distributed`).
    """
    from tftpu.utils import distributed
    if not isinstance(model, TopModel):
        raise UsageError(f"calibrate takes a TOP model (tftpu.frontend.load(path)), not {type(model).__name__}")
    samples = _as_samples(model, samples)
    methods = _methods(method)
    for m in methods:
        _check(m, samples, bins)
    if isinstance(tune_num, bool) or not isinstance(tune_num, (int, np.integer)) or tune_num < 1:
        raise UsageError(f"tune_num {tune_num!r}: give at least 1")
    distributed.check_workers(workers, cluster)
    if workers > 1:
        return _launch(model, samples, workers, method=method, bins=bins, asymmetric=asymmetric, tune_num=tune_num)
    if cluster is None or cluster.size == 1:
        stats, count, head = _collect(model, samples, bins, keep=tune_num if "auto" in methods else 0)
        return _with_alternates(model, stats, count, head, methods, bins, asymmetric)
    if not isinstance(samples, Samples):
        samples = Samples(model, samples, what="calibration samples")
    part = samples.shard(cluster.rank, cluster.size)
    stats, count, _ = _collect(model, part, bins, empty=True)
    distributed.mark("statistics")
    stats, count = merge_statistics(stats, count, bins, cluster)
    distributed.mark("merge")
    samples.skipped = sorted(name for names in cluster.gather_json(part.skipped) for name in names)
    if count == 0:
        raise InputError("calibration needs at least one sample input" + (
            f" ({len(samples.skipped)} unreadable skipped)" if samples.skipped else ""))
    table = None
    if cluster.is_chief:                 # the thresholds (and auto's judging) once, then shared
        head = list(itertools.islice(samples, tune_num)) if "auto" in methods else []
        table = _with_alternates(model, stats, count, head, methods, bins, asymmetric)
    return CalibrationTable.from_json(cluster.broadcast_json(table.to_json() if table else None))


def _as_samples(model, samples):
    """`samples` as `calibrate` iterates them: a list of input dicts (or any iterable of them, a
    `Samples` stream) as given; one dict, an array, a path, or a list of anything else read as
    `tftpu.quant.iter_samples` reads it (typed errors for what is none of those)."""
    if samples is None:
        raise UsageError("calibration samples: none given (a list of input dicts, arrays, a directory or a "
                         "tf.data.Dataset)")
    if isinstance(samples, Samples) or isinstance(samples, (list, tuple)) and all(isinstance(x, dict) for x in samples):
        return samples
    if isinstance(samples, (dict, np.ndarray, str, Path, list, tuple)) or hasattr(samples, "numpy"):
        return Samples(model, samples, what="calibration samples")
    return samples


def calibrate_each(model, samples, methods, bins: int = BINS, asymmetric: bool = False,
                   tune_num: int = TUNE_NUM) -> dict[str, CalibrationTable]:
    """A table per method of `methods` (each the one `calibrate` makes with it) from one pass over
    `samples`: the thresholds differ, the statistics they are chosen from do not."""
    methods = list(dict.fromkeys(methods))
    if not methods:
        raise UsageError("calibrate_each needs at least one method")
    return calibrate(model, samples, ",".join(methods), bins, asymmetric, tune_num).tables()


def _methods(spec: str) -> list[str]:
    """The methods of "mse" or "mse,tail_mse", in order, each once."""
    if not isinstance(spec, str):
        raise UsageError(f"calibration method {spec!r}: expected one of {', '.join(CALIBRATION_METHODS)}")
    return list(dict.fromkeys(m.strip() for m in spec.split(",")))


def _with_alternates(model, stats, count, head, methods, bins, asymmetric) -> CalibrationTable:
    """The first method's table, the others' its alternates."""
    first, *rest = (_table(model, stats, count, head, m, bins, asymmetric) for m in methods)
    first.alternates = {t.method: t for t in rest}
    return first


def _table(model, stats, count, head, method, bins, asymmetric) -> CalibrationTable:
    chosen: dict[str, str] = {}
    if method == "auto":
        chosen = _auto(model, head, stats, asymmetric)
    entries = {}
    for name, st in progress(list(stats.items()), desc=f"{method} thresholds", unit="tensor"):
        m = chosen.get(name, method)
        lo, hi = st.range_of(m) if asymmetric else (st.lo, st.hi)
        entries[name] = (st.threshold(m), lo, hi)
    return CalibrationTable(entries, method, count, bins, asymmetric=asymmetric, chosen=chosen)


def _launch(model, samples, workers: int, **options) -> CalibrationTable:
    """`calibrate` on `workers` local processes (`tftpu.utils.distributed.launch`)."""
    import tempfile

    from tftpu.utils import distributed
    if not isinstance(samples, Samples):
        raise UsageError("calibrate(workers=N) reads the dataset in each worker: pass "
                         "tftpu.quant.iter_samples(model, path) of a directory, a glob or TFRecord files")
    spec = samples.spec()
    with tempfile.TemporaryDirectory(prefix="tftpu_calibrate_") as tmp:
        path = model.save(f"{tmp}/model.top.mlir")[0]
        result = distributed.launch("tftpu.quant.calibrate:calibrate_job",
                                    {"model": str(path), "samples": spec, **options}, workers)
    samples.skipped = result["skipped"]
    return CalibrationTable.from_json(result["table"])


def calibrate_job(cluster, model: str, samples: dict, **options) -> dict:
    """One worker's part of `calibrate(workers=N)` (run by `tftpu.utils.distributed`)."""
    from tftpu.ir.module import load
    from tftpu.quant.dataset import iter_samples
    from tftpu.utils import distributed
    top = load(model)
    distributed.mark("model")
    stream = iter_samples(top, **samples)
    table = calibrate(top, stream, cluster=cluster, **options)
    return {"table": table.to_json(), "skipped": stream.skipped}


def _candidates(st: TensorStatistics, asymmetric: bool) -> list[tuple[str, object]]:
    """The distinct candidates of `auto` for one tensor, each under the first method giving it."""
    seen: dict[object, str] = {}
    for m in AUTO_CANDIDATES:
        value = st.range_of(m) if asymmetric else st.threshold(m)
        seen.setdefault(value, m)
    return [(m, v) for v, m in seen.items()]


def _quantized(arr: np.ndarray, value, asymmetric: bool) -> np.ndarray:
    """`fake_quant` / `fake_quant_asymmetric` in the tensor's own precision, for judging candidates."""
    if arr.dtype != np.float32:
        return fake_quant_asymmetric(arr, *value) if asymmetric else fake_quant(arr, value)
    if asymmetric:
        lo, hi = value
        if not hi > lo:
            return arr
        scale = (hi - lo) / 255.0
        zp = float(np.clip(np.rint(-128.0 - lo / scale), -128, 127))
        q = arr / np.float32(scale)
        np.rint(q, out=q)
        q += np.float32(zp)
        np.clip(q, -128, 127, out=q)
        q -= np.float32(zp)
    else:
        if not value > 0:
            return arr
        scale = value / 127.0
        q = arr / np.float32(scale)
        np.rint(q, out=q)
        np.clip(q, -127, 127, out=q)
    q *= np.float32(scale)
    return q


def _sq(x: np.ndarray) -> float:
    """Sum of squares (numpy's pairwise sum: the same bits on every run, unlike a BLAS dot)."""
    return float(np.square(x).sum(dtype=np.float64))


def _energy(ref: np.ndarray) -> float:
    e = _sq(ref)
    return e if e > 0 else 1.0


def _auto(model, samples: list[dict], stats: dict[str, TensorStatistics], asymmetric: bool,
          cands: dict[str, list] | None = None) -> dict[str, str]:
    """Per tensor, the candidate method whose fake-quantized tensor changes its consumers least."""
    from tftpu.interp.kernels import KERNELS
    from tftpu.ir import top
    from tftpu.ir.base import value_name
    from xdsl.dialects.builtin import NoneType

    if cands is None:
        cands = {n: _candidates(st, asymmetric) for n, st in stats.items()}
    tuned = {n for n, c in cands.items() if len(c) > 1}
    weights: dict[str, np.ndarray] = {}
    steps = []           # (kernel, operand names, attrs, op description) of ops reading a tuned tensor
    trigger: dict[str, int] = {}   # an op's last result name -> its index in steps
    uses: dict[str, int] = {}
    for op in model.ops:
        if isinstance(op, (top.NoneOp, top.Input)):
            continue
        if isinstance(op, top.Weight):
            weights[value_name(op.results[0])] = model.weights[op.key]
            continue
        ins = [None if isinstance(v.type, NoneType) else value_name(v) for v in op.operands]
        if not tuned.intersection(ins):
            continue
        for n in set(ins) - {None}:
            uses[n] = uses.get(n, 0) + 1
        trigger[value_name(op.results[-1])] = len(steps)
        steps.append((KERNELS[op.name], ins, op.attrs(), f"{op.name} at {op.loc!r}", [value_name(r) for r in op.results]))
    outputs = set(model.output_names) & tuned
    firsts = {o for step in steps for o in step[4][:-1]}   # earlier results of multi-result consumers
    score = {n: np.zeros(len(cands[n])) for n in tuned}

    for sample in progress(samples, desc="auto: judging candidates", unit="input"):
        env: dict[str, np.ndarray] = {}
        left = dict(uses)

        def observe(name, arr, env=env, left=left):
            if name in uses or name in firsts:
                env[name] = arr
            if name in outputs:
                e = _energy(arr)
                score[name] += [_sq(_quantized(arr, v, asymmetric) - arr) / e for _, v in cands[name]]
            k = trigger.get(name)
            if k is None:
                return arr
            kernel, ins, attrs, what, outs = steps[k]
            ref = [r for r in [env.get(o) for o in outs[:-1]] + [arr] if r is not None and r.dtype.kind == "f"]
            energy = [_energy(r) for r in ref]
            for t in dict.fromkeys(n for n in ins if n in tuned):
                for c, (_, value) in enumerate(cands[t]):
                    q = _quantized(env[t], value, asymmetric)
                    args = [None if n is None else q if n == t else env[n] if n in env else weights[n] for n in ins]
                    try:
                        got = kernel(args, attrs)
                    except (TftpuError, InternalError):
                        raise
                    except Exception as e:
                        raise KernelError(what, f"kernel failed on a fake-quantized input: {type(e).__name__}: {e}") from e
                    got = [g for g in got if g.dtype.kind == "f"]
                    score[t][c] += sum(_sq(g - r) / e for r, g, e in zip(ref, got, energy))
            for n in set(ins) - {None}:
                left[n] -= 1
                if left[n] == 0:
                    env.pop(n, None)
            for o in outs[:-1]:
                if o not in uses:
                    env.pop(o, None)
            return arr

        TopInterpreter(model).run(sample, observe=observe)
    chosen = {}
    for name in stats:
        c = cands[name]
        chosen[name] = c[int(np.argmin(score[name]))][0] if name in tuned else c[0][0]
    return chosen


def calibrate_two_pass(model, samples: list[dict], method: str = "mse", bins: int = BINS) -> CalibrationTable:
    """The previous implementation (symmetric methods only), kept as the reference `calibrate` is
    checked against: a pass for min/max, then a pass for |x| histograms over exactly [0, largest |x|],
    each keeping every tensor of a sample (`dump_all`)."""
    _check(method, samples, bins)
    if method == "auto":
        raise UsageError("calibrate_two_pass: auto is not one of its methods")
    interp = TopInterpreter(model)
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for sample in samples:
        for name, arr in interp.run(sample, dump_all=True).items():
            if arr.dtype.kind != "f" or arr.size == 0:
                continue
            a = arr.astype(np.float64, copy=False)
            lo[name] = min(lo.get(name, np.inf), float(a.min()))
            hi[name] = max(hi.get(name, -np.inf), float(a.max()))
    absmax = {n: max(abs(lo[n]), abs(hi[n])) for n in lo}
    hists = {n: np.zeros(bins, np.int64) for n in lo}
    for sample in samples:
        for name, arr in interp.run(sample, dump_all=True).items():
            if name in hists and absmax[name] > 0:
                mags = np.abs(arr.astype(np.float64, copy=False)).ravel()
                counts, _ = np.histogram(mags[mags != 0], bins, (0.0, absmax[name]))
                hists[name] += counts
    entries = {n: (threshold(method, hists[n], absmax[n]), lo[n], hi[n]) for n in lo}
    return CalibrationTable(entries, method, len(samples), bins)
