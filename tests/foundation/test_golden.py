"""Restructurings keep behaviour, and the artefacts do not depend on the machine.

`tftpu-transform`'s `.mlir` and weights and `tftpu-calibrate`'s mse table for mediapipe's
selfie segmentation and face detector (real weights, from their PyPI wheel), on three photos:

- run twice, they are the same bytes;
- the `.mlir` and weights are pinned by sha256 (nothing in their making rounds differently on
  another CPU);
- the table is first held to what any CPU must meet (the golden table's tensors, in order, each
  number within `TOLERANCE` of the tensor's largest |x|), then compared byte for byte with it:
  every number in a table lies on the tensor's power-of-two grid (`tftpu.quant.calibrate`),
  which the last-bit float noise between CPUs' kernels (oneDNN, MLAS, Eigen pick code paths
  per ISA) does not move. Two tests make such noise here and check the bytes stay: weights
  perturbed by a few ulps, and an AVX2-only CPU's float kernels in a subprocess.

A deliberate change of output updates the pins and `golden/` in the same commit, saying why:
run this file with `TFTPU_GOLDEN_UPDATE=1` to rewrite the golden tables and print the digests.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import material

GOLDEN = Path(__file__).with_name("golden")
# model -> (sha256 of .top.mlir, of its weights .npz); the tables are golden/<model>_cali_table
PINNED = {
    "selfie_segmentation": (
        "902b28b1e11d77490264f06be05f7c765780fe09a380ae34c9bf5b647ce9a252",
        "e277ef2ea37b8ee7a92837bb71f23b5c930bae18da2aef2134d7837b3ff5dcf2",
    ),
    "face_detection_short_range": (
        "1c61fd1d72820631c6956e11478d8ad96b1f29cd31a0e3cc33bcf78561da4cdc",
        "df369d64e448a380f148cd92e9c710f2a1a2fc2f793689114b56271d4dbb3151",
    ),
}
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")
# What any CPU must meet: each threshold / min / max within 2% of the tensor's largest |x|
# (a value that float noise tips over a grid point moves one step: 1/256 of the range or less).
TOLERANCE = 0.02
ULPS = 4    # the weight noise of test_table_ignores_last_bit_noise, in float32 ulps


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _samples(model) -> list[dict]:
    (inp,) = model.input_names
    shape = model.ops[0].results[0].type.get_shape()
    h, w = (shape[1], shape[2]) if shape[-1] == 3 else (shape[2], shape[3])
    samples = []
    for photo in PHOTOS:
        x = material.image(photo, (w, h)).astype(np.float32)[None] / 255.0
        samples.append({inp: x if shape[-1] == 3 else x.transpose(0, 3, 1, 2)})
    return samples


def artefacts(name: str, out: Path) -> tuple[Path, Path, Path]:
    """Transform the model, calibrate it on three photos; the paths of what was written."""
    from tftpu import quant
    from tftpu.pipelines.transform import transform

    r = transform(material.get(f"{name}.tflite"), name=name, mlir=out / f"{name}.top.mlir")
    quant.calibrate(r.model, _samples(r.model), "mse").save(out / f"{name}_cali_table")
    return r.mlir, r.weights, out / f"{name}_cali_table"


def _rows(text: str) -> dict[str, tuple[float, float, float]]:
    return {p[0]: tuple(map(float, p[1:4])) for p in (ln.split() for ln in text.splitlines())
            if p and not p[0].startswith("#")}


def meaning_differences(got: str, golden: str) -> list[str]:
    """Where table text `got` departs from `golden` beyond what float noise may do on any CPU:
    other headers, tensors or order, or a number off by more than TOLERANCE x the tensor's largest |x|."""
    head = [ln for ln in got.splitlines() if ln.startswith("#")]
    if head != [ln for ln in golden.splitlines() if ln.startswith("#")]:
        return ["the headers differ"]
    a, b = _rows(got), _rows(golden)
    if list(a) != list(b):
        return [f"tensors differ: {sorted(set(a) ^ set(b))[:5]} (or their order)"]
    bad = []
    for name, want in b.items():
        scale = max(abs(want[1]), abs(want[2]), 1e-30)
        for col, x, y in zip(("threshold", "min", "max"), a[name], want):
            if abs(x - y) > TOLERANCE * scale:
                bad.append(f"{name} {col} {x} (golden {y})")
    return bad


@pytest.mark.parametrize("name", sorted(PINNED))
def test_artefacts_are_pinned(name, tmp_path):
    first = artefacts(name, tmp_path / "a")
    second = artefacts(name, tmp_path / "b")
    for p, q in zip(first, second):
        assert p.read_bytes() == q.read_bytes(), f"{p.name}: two runs on this machine differ"
    mlir, weights, table = first
    golden = GOLDEN / table.name
    if os.environ.get("TFTPU_GOLDEN_UPDATE"):
        golden.write_bytes(table.read_bytes())
        print(f'\n    "{name}": (\n        "{_sha(mlir)}",\n        "{_sha(weights)}",\n    ),')
    assert (_sha(mlir), _sha(weights)) == PINNED[name], f"{name}: .mlir / weights changed"
    got, want = table.read_text(), golden.read_text()
    bad = meaning_differences(got, want)
    assert not bad, f"{name}: the table departs from golden/{golden.name}:\n" + "\n".join(bad[:20])
    changed = [f"{x}  (golden: {y})" for x, y in zip(got.splitlines(), want.splitlines()) if x != y]
    assert got == want, (f"{name}: the table is within tolerance of golden/{golden.name} but not the same "
                         f"bytes: float noise tipped a grid point or a near tie:\n" + "\n".join(changed[:20]))


@pytest.fixture(scope="module")
def top_models(tmp_path_factory):
    """Each model transformed once: (TopModel, samples, saved .top.mlir)."""
    from tftpu.pipelines.transform import transform

    out = tmp_path_factory.mktemp("golden")
    found = {}
    for name in sorted(PINNED):
        r = transform(material.get(f"{name}.tflite"), name=name, mlir=out / f"{name}.top.mlir")
        samples = _samples(r.model)
        np.savez(out / f"{name}_samples.npz", *[next(iter(s.values())) for s in samples])
        found[name] = (r.model, samples, r.mlir)
    return found


def _perturbed(model, ulps: int, seed: int = 0):
    """`model` with every float weight array (not scalar constants: clamp bounds stay exact)
    multiplied by 1 + k 2^-23, k uniform in [-ulps, ulps]."""
    from tftpu.ir.module import TopModel

    rng = np.random.default_rng(seed)
    weights = {}
    for key, w in model.weights.items():
        if w.dtype == np.float32 and w.size > 1:
            w = w * (1 + rng.integers(-ulps, ulps + 1, w.shape) * 2.0 ** -23).astype(np.float32)
        weights[key] = w
    return TopModel(model.module, weights)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_table_ignores_last_bit_noise(name, top_models):
    """Weights a few ulps off move the activations the way another CPU's float kernels do (a
    test checks most tensors' raw extremes do change); the table's bytes do not."""
    from tftpu import quant

    C = importlib.import_module("tftpu.quant.calibrate")
    model, samples, _ = top_models[name]
    noisy = _perturbed(model, ULPS)
    clean_stats, noisy_stats = C.collect(model, samples), C.collect(noisy, samples)
    moved = sum((a.vmin, a.vmax) != (b.vmin, b.vmax) for a, b in zip(clean_stats.values(), noisy_stats.values()))
    assert moved > len(clean_stats) // 2, f"the perturbation moved the extremes of only {moved} tensors"
    table, noisy_table = quant.calibrate(model, samples, "mse"), quant.calibrate(noisy, samples, "mse")
    assert noisy_table.text() == table.text() == (GOLDEN / f"{name}_cali_table").read_text()


_AVX2_RUN = """
import sys, numpy as np
from pathlib import Path
from tftpu import ir, quant
from tftpu.quant.calibrate import collect
model = ir.load(sys.argv[1])
data = np.load(sys.argv[2])
samples = [{model.input_names[0]: data[k]} for k in data.files]
print(repr(sorted((n, s.vmin, s.vmax) for n, s in collect(model, samples).items())))
quant.calibrate(model, samples, "mse").save(sys.argv[3])
"""


def avx2_float_kernels() -> dict[str, str]:
    """The environment in which this machine runs the float kernels an AVX2-only CPU runs (as
    .ci/run sets it): TensorFlow leaves oneDNN off there and Eigen splits sums by thread count;
    numpy dispatches no AVX-512 loops."""
    from tftpu.utils import native

    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_NUM_INTRAOP_THREADS": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    if "avx512f" in native.cpu_flags():
        env["NPY_DISABLE_CPU_FEATURES"] = "X86_V4 AVX512_ICL AVX512_SPR"
    return env


def test_the_table_is_the_same_with_an_avx2_cpus_float_kernels(top_models, tmp_path):
    """An AVX2-only CPU's float kernels round activations differently from this machine's (the
    raw extremes change), the tables do not. Where the two are the same kernels (this machine
    is such a CPU, or already runs so) the raw extremes agree too, and the tables still must."""
    from tftpu.quant.calibrate import collect

    for name, (model, samples, mlir) in top_models.items():
        out = tmp_path / f"{name}_cali_table"
        done = subprocess.run([sys.executable, "-c", _AVX2_RUN, str(mlir), str(mlir.parent / f"{name}_samples.npz"),
                               str(out)], capture_output=True, text=True, env=avx2_float_kernels(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert out.read_text() == (GOLDEN / out.name).read_text(), f"{name}: the table changed with AVX2 float kernels"
        raw = repr(sorted((n, s.vmin, s.vmax) for n, s in collect(model, samples).items()))
        assert done.stdout.strip(), f"{name}: the AVX2 run printed no raw extremes"
        assert raw, name
