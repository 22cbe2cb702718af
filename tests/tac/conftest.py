"""Shared fixtures of the TAC tests: models built once per session, real material on demand."""

import pytest

from tests.tac import models


@pytest.fixture(scope="session")
def model_bytes():
    """name -> .tflite bytes (built with TF's converter on first use)."""
    cache = {}
    builders = {
        "mixed": lambda: models.mixed(),
        "mixed_fp16": lambda: models.mixed("fp16"),
        "mixed_int8": lambda: models.mixed("int8"),
        "hybrid": models.hybrid,
        "while": models.while_loop,
        "custom": models.custom_op,
        "sparse": models.sparse,
        "chain": lambda: models.chain(12, width=32, size=32),
        "selfie": lambda: _material("selfie_segmentation.tflite"),
        "face": lambda: _material("face_detection_short_range.tflite"),
    }

    def get(name):
        if name not in cache:
            cache[name] = builders[name]()
        return cache[name]

    return get


def _material(name):
    from tests import material

    with open(material.get(name), "rb") as f:
        return f.read()
