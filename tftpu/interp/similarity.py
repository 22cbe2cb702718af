"""Similarity of two results, tensor by tensor: cosine, euclidean similarity and SQNR.

The definitions are TPU-MLIR's (the paper, section 3.6, and its `tensor_compare.py`), so
tolerances carry over from it (F32 "0.99,0.99"; BF16 > 0.95 cosine; INT8 > 0.9 cosine):

- cosine = a.b / (|a| |b|); 1 when both are all zeros, 0 when only one is.
- euclidean similarity = 1 - |a - b| / (|(a + b) / 2| + 1e-7).
- SQNR (dB) = 10 log10(var(ref) / var(ref - test)), both mean-removed (so a constant offset
  is no noise); +inf when the noise is constant, -inf when only the reference is.

A float tensor that is zero in exact arithmetic (the mean over channels of a LayerNorm output)
holds only rounding error, and its cosine against another float run is noise too. So, in a
comparison of whole models, a tensor passes with the note "rounding noise" when its reference
and its difference both stay under the noise floor: `NOISE_ULPS` float epsilons of the largest
magnitude in the reference dump (`noise_floor`).

>>> r = compare_tensors({"x": np.ones(3)}, {"x": np.ones(3)}, "0.99,0.99")
>>> r.passed, r.rows[0].cosine
(True, 1.0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from tftpu import errors
from tftpu.utils import npz as _npz

EUCLID_EPS = 1e-7
NOISE_ULPS = 64


def _f64(x) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float64, copy=False).ravel()


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """a . b in float64 by numpy's pairwise sum, not BLAS: the same bits on any number of BLAS
    threads (a multi-threaded ddot sums its parts in another order)."""
    return float(np.sum(a * b))


def cosine_similarity(a, b) -> float:
    """Cosine of the angle between `a` and `b` (flattened), computed in float64."""
    a, b = _f64(a), _f64(b)
    na, nb = math.sqrt(_dot(a, a)), math.sqrt(_dot(b, b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return min(1.0, max(-1.0, _dot(a, b) / (na * nb)))


def euclidean_similarity(a, b) -> float:
    """1 - |a - b| / (|(a + b) / 2| + 1e-7), TPU-MLIR's euclidean similarity (1 = identical)."""
    a, b = _f64(a), _f64(b)
    d, m = a - b, (a + b) / 2
    ed = math.sqrt(_dot(d, d))
    sr = math.sqrt(_dot(m, m)) + EUCLID_EPS
    if math.isinf(ed) or math.isinf(sr):
        return 0.0
    return 1.0 - ed / sr


def _sum_of_squares(x: np.ndarray) -> float:
    """`_dot(x, x)`, squaring `x` in place (the same products and sum, no temporary)."""
    return float(np.sum(np.square(x, out=x)))


def sqnr(ref, test) -> float:
    """Signal-to-quantization-noise ratio in dB of `test` against `ref` (not symmetric)."""
    raw = np.array(ref, np.float64).ravel()          # a copy: centred in place below
    if raw.size == 0:
        return math.inf
    noise = np.subtract(raw, np.asarray(test).ravel(), dtype=np.float64)
    noise -= noise.mean()
    raw -= raw.mean()
    var_raw, var_noise = _sum_of_squares(raw), _sum_of_squares(noise)
    if var_noise == 0.0:
        return math.inf
    if var_raw == 0.0:
        return -math.inf
    return 10.0 * math.log10(var_raw / var_noise)


def max_relative_difference(want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], names) -> float:
    """The largest |got - want| over each named tensor's largest |want| (how far a float rewrite
    moved a model's outputs; 0 for no names)."""
    return max((float(np.max(np.abs(_f64(want[n]) - _f64(got[n])))) / (float(np.max(np.abs(_f64(want[n])))) + 1e-30)
                for n in names), default=0.0)


def noise_floor(tensors) -> float:
    """`NOISE_ULPS` epsilons (float32's unless all are float64) of the largest |value| in `tensors`."""
    scale, eps = 0.0, 0.0
    for t in tensors:
        t = np.asarray(t)
        if t.dtype.kind != "f" or t.size == 0:
            continue
        largest = max(float(t.max()), -float(t.min()))  # two reductions, no copy: all finite unless inf/nan
        if not math.isfinite(largest):
            finite = t[np.isfinite(t)]
            largest = float(np.max(np.abs(finite))) if finite.size else None
        if largest is not None:
            scale = max(scale, largest)
        eps = max(eps, float(np.finfo(np.float32 if t.dtype.itemsize <= 4 else t.dtype).eps))
    return NOISE_ULPS * eps * scale


def parse_tolerance(text: str | Sequence[float]) -> tuple[float, float]:
    """"cos,euclid" (e.g. "0.99,0.99") -> (0.99, 0.99); a UsageError when malformed."""
    try:
        parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
        if len(parts) != 2:
            raise ValueError
        cos, euc = float(parts[0]), float(parts[1])
    except (TypeError, ValueError):
        raise errors.UsageError(
            f"tolerance must be two numbers 'cosine,euclidean', e.g. 0.99,0.99, not {text!r}"
        ) from None
    if not (-1.0 <= cos <= 1.0 and euc <= 1.0) or math.isnan(cos) or math.isnan(euc):
        raise errors.UsageError(f"tolerance {text!r}: cosine must lie in [-1, 1], euclidean <= 1")
    return cos, euc


@dataclasses.dataclass(frozen=True)
class TensorComparison:
    """One row of a comparison: a tensor's similarity figures and whether it passes."""

    name: str
    shape: tuple
    cosine: float
    euclid: float
    sqnr: float
    passed: bool
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Rows for the tensors both sides hold, names only one side holds, and the tolerance."""

    rows: list[TensorComparison]
    only_a: list[str]
    only_b: list[str]
    tolerance: tuple[float, float]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failed(self) -> list[TensorComparison]:
        return [r for r in self.rows if not r.passed]


def compare_arrays(name: str, a, b, tolerance=(0.99, 0.99), floor: float = 0.0) -> TensorComparison:
    """Compare one tensor `b` against the reference `a` under `tolerance` (cos, euclid).

    A float tensor whose reference and difference both stay within `floor` passes as rounding
    noise (see `noise_floor`).
    """
    cos_tol, euc_tol = parse_tolerance(tolerance)
    a, b = np.asarray(a), np.asarray(b)
    shape = tuple(a.shape)
    nan = float("nan")
    if a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16":
        return TensorComparison(name, shape, nan, nan, nan, False, f"dtype {a.dtype}")
    if b.dtype.kind not in "biuf" and b.dtype.name != "bfloat16":
        return TensorComparison(name, shape, nan, nan, nan, False, f"dtype {b.dtype}")
    notes = []
    if a.shape != b.shape:
        if a.size != b.size:
            return TensorComparison(name, shape, nan, nan, nan, False,
                                    f"shape {_fmt_shape(a.shape)} vs {_fmt_shape(b.shape)}")
        notes.append(f"reshaped from {_fmt_shape(b.shape)}")
    fa, fb = _f64(a), _f64(b)
    finite = np.isfinite(fa) & np.isfinite(fb)
    if not finite.all():
        bad = ~finite
        same = (fa[bad] == fb[bad]) | (np.isnan(fa[bad]) & np.isnan(fb[bad]))
        if not same.all():
            return TensorComparison(name, shape, nan, nan, nan, False,
                                    f"{int((~same).sum())} non-finite values differ")
        notes.append(f"{int(bad.sum())} matching non-finite values skipped")
        fa, fb = fa[finite], fb[finite]
        if not fa.size:
            return TensorComparison(name, shape, nan, nan, nan, False, "no finite value to compare")
    if a.dtype == b.dtype and np.array_equal(fa, fb):
        notes.insert(0, "equal")
    cos, euc, snr = cosine_similarity(fa, fb), euclidean_similarity(fa, fb), sqnr(fa, fb)
    passed = cos >= cos_tol and euc >= euc_tol
    if not passed and floor > 0 and a.dtype.kind == "f" and fa.size and \
            float(np.max(np.abs(fa))) <= floor and float(np.max(np.abs(fa - fb))) <= floor:
        passed = True
        notes.append(f"rounding noise: |ref|, |diff| <= {_fmt_num(floor, 3)}")
    return TensorComparison(name, shape, cos, euc, snr, passed, "; ".join(notes))


def compare_tensors(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray],
                    tolerance="0.99,0.99", floor: float | None = None) -> Comparison:
    """Compare every tensor both dicts hold (in `a`'s order); `a` is the reference.

    `floor`: the rounding-noise floor; by default `noise_floor` of `a`'s shared tensors.
    """
    tol = parse_tolerance(tolerance)
    if floor is not None and not (isinstance(floor, (int, float, np.number)) and 0.0 <= floor < math.inf):
        raise errors.UsageError(f"noise floor {floor!r}: expected a finite number >= 0 (0 turns it off)")
    if floor is None:
        floor = noise_floor(a[k] for k in a if k in b)
    rows = [compare_arrays(k, a[k], b[k], tol, floor) for k in a if k in b]
    return Comparison(rows, [k for k in a if k not in b], [k for k in b if k not in a], tol)


def load_npz(path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file, read without pickle; a ModelFileError names what is wrong
    (a lone .npy is refused: a comparison needs named tensors)."""
    return _npz.load_npz(path, allow_npy=False)


def _fmt_shape(shape) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def _fmt_num(v: float, digits: int = 6) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}f}" if abs(v) < 1e4 else f"{v:.3e}"


def format_table(result: Comparison, names: tuple[str, str] = ("a", "b")) -> str:
    """A readable table of `result`: one line per tensor, then the tensors only one side has
    and a summary line."""
    header = ("tensor", "shape", "cosine", "euclid", "sqnr(dB)", "result")
    lines = [(r.name, _fmt_shape(r.shape), _fmt_num(r.cosine), _fmt_num(r.euclid),
              _fmt_num(r.sqnr, 2), ("PASS" if r.passed else "FAIL")
              + (f" ({r.note})" if r.note else "")) for r in result.rows]
    widths = [max([len(header[i])] + [len(ln[i]) for ln in lines]) for i in range(5)]

    def row(cells):
        left = [cells[0].ljust(widths[0]), cells[1].ljust(widths[1])]
        right = [cells[i].rjust(widths[i]) for i in range(2, 5)]
        return "  ".join(left + right + [cells[5]]).rstrip()

    out = [row(header), row(tuple("-" * w for w in widths) + ("------",))]
    out += [row(ln) for ln in lines]
    if result.only_a:
        out.append(f"only in {names[0]}: {', '.join(result.only_a)}")
    if result.only_b:
        out.append(f"only in {names[1]}: {', '.join(result.only_b)}")
    cos, euc = result.tolerance
    n_fail = len(result.failed)
    summary = (f"{len(result.rows)} compared, {len(result.rows) - n_fail} passed, {n_fail} failed"
               f" (tolerance cosine >= {cos:g}, euclidean >= {euc:g})")
    scored = [r for r in result.rows if not math.isnan(r.cosine)]
    if scored:
        worst_c = min(scored, key=lambda r: r.cosine)
        worst_e = min(scored, key=lambda r: r.euclid)
        summary += (f"; min cosine {_fmt_num(worst_c.cosine)} ({worst_c.name}),"
                    f" min euclid {_fmt_num(worst_e.euclid)} ({worst_e.name})")
    out.append(summary)
    return "\n".join(out) + "\n"
