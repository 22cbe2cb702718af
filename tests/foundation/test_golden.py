"""Restructurings keep behaviour: the artefacts of two real models are pinned byte for byte.

`tftpu-transform`'s `.mlir` and weights and `tftpu-calibrate`'s table for mediapipe's
selfie segmentation and face detector (real weights, from their PyPI wheel) must stay
identical while the compiler core changes shape underneath. A deliberate change of output
(a new attribute, a new canonicalization) updates the pins below in the same commit, saying
why; run this file with `TFTPU_GOLDEN_PRINT=1` to print the new digests.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from tests import material

# model -> (sha256 of .top.mlir, of its weights .npz, of the mse calibration table)
PINNED = {
    "selfie_segmentation": (
        "902b28b1e11d77490264f06be05f7c765780fe09a380ae34c9bf5b647ce9a252",
        "e277ef2ea37b8ee7a92837bb71f23b5c930bae18da2aef2134d7837b3ff5dcf2",
        "b74cfc6e348bf4a8df131face00f8dfad18793362414857327e0eabd6108305c",
    ),
    "face_detection_short_range": (
        "1c61fd1d72820631c6956e11478d8ad96b1f29cd31a0e3cc33bcf78561da4cdc",
        "df369d64e448a380f148cd92e9c710f2a1a2fc2f793689114b56271d4dbb3151",
        "7edd9fa6f1c0387cfb11b7f974751f52505ccda511efd2243334bc793f2074f2",
    ),
}
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def artefacts(name: str, out) -> tuple[str, str, str]:
    """Transform the model, calibrate it on three photos; the digests of what was written."""
    from tftpu import quant
    from tftpu.pipelines.transform import transform

    r = transform(material.get(f"{name}.tflite"), name=name, mlir=out / f"{name}.top.mlir")
    (inp,) = r.model.input_names
    shape = r.model.ops[0].results[0].type.get_shape()
    h, w = (shape[1], shape[2]) if shape[-1] == 3 else (shape[2], shape[3])
    samples = []
    for photo in PHOTOS:
        x = material.image(photo, (w, h)).astype(np.float32)[None] / 255.0
        samples.append({inp: x if shape[-1] == 3 else x.transpose(0, 3, 1, 2)})
    table = quant.calibrate(r.model, samples, "mse")
    table.save(out / f"{name}_cali_table")
    return _sha(r.mlir), _sha(r.weights), _sha(out / f"{name}_cali_table")


@pytest.mark.parametrize("name", sorted(PINNED))
def test_artefacts_are_pinned(name, tmp_path):
    got = artefacts(name, tmp_path)
    if os.environ.get("TFTPU_GOLDEN_PRINT"):
        print(f'\n    "{name}": (\n' + "".join(f'        "{d}",\n' for d in got) + "    ),")
    assert got == PINNED[name], f"{name}: .mlir / weights / calibration table changed"
