"""A truncated or damaged `.mlir` fails fast with one clear error, never a hang.

xDSL's lexer takes time exponential in the length of an unterminated string literal (a file cut
inside `loc("...`); `parse_module` refuses such a line before xDSL sees it.
"""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu.errors import ModelFileError
from tftpu.ir import TopBuilder, parse_module


def _text() -> str:
    b = TopBuilder("m")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Conv", [x, b.weight("a_rather_long_weight_name_of_forty_chars", np.ones((4, 3, 3, 3), np.float32)),
                      b.none()], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
             "a/rather/long/tensor/name/that/goes/on/and/on:0")
    return b.finish([b.op("Relu", [y], {}, "out")]).text()


TEXT = _text()


def _parse_fast(text: str) -> None:
    t0 = time.perf_counter()
    try:
        parse_module(text, "cut.mlir")
    except ModelFileError as e:
        assert str(e).startswith("cut.mlir: ")
    assert time.perf_counter() - t0 < 1.0


def test_every_truncation_fails_fast():
    for cut in range(len(TEXT)):
        _parse_fast(TEXT[:cut])


def test_open_string_names_its_line():
    cut = TEXT.index('loc("a/rather') + 40
    try:
        parse_module(TEXT[:cut], "cut.mlir")
    except ModelFileError as e:
        assert "unterminated string" in str(e) and "line" in str(e)
    else:
        raise AssertionError("accepted a truncated file")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(TEXT) - 1), st.integers(0, 255))
def test_flipped_bytes_fail_fast(pos, value):
    data = bytearray(TEXT.encode())
    data[pos] = value
    _parse_fast(data.decode("utf-8", errors="replace"))


def test_strings_with_escapes_and_comments_still_parse():
    module = parse_module('"builtin.module"() ({\n}) {a = "x\\"y // z"} : () -> () // odd " quote\n')
    assert module is not None
