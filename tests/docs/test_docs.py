"""Every code block of the documentation runs as pasted, page by page, in an empty directory.

Each page of docs/ runs in its own temporary directory, its ```bash and ```python blocks in
order (tests/docs/markdown_blocks.py: the rules, shared with tests/test_readme.py), so a reader
can start at any guide. Leading blocks that pages share byte for byte (deploy.md and
quantize.md build the same TOP model and calibration table first) run once per session, as
pasted in an empty directory of their own, and each of those pages goes on from a copy of it
(`SharedPrefixes`). The figures a page quotes that are deterministic are checked against what
its blocks print (CHECKS). By hand: `python -m tests.docs.test_docs docs/guides/tac.md` prints
each block's output.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import (ROOT, SharedPrefixes, blocks, check_quoted, environment, output_of, run_block,
                                        run_page, runnable)

DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
RUNNABLE = [p for p in PAGES if runnable(blocks((DOCS / p).read_text(encoding="utf-8")))]


def _import(done, all_blocks, cwd):
    import onnx

    assert len(onnx.load(cwd / "m.onnx").graph.node) == 51               # "51 ONNX nodes -> 34 TOP ops"
    assert "77 ops" in output_of(done, "--model_def=m.onnx")
    from tftpu import ir

    top = ir.load(cwd / "m.top.mlir")
    assert sum(op.name not in ("top.Input", "top.Weight", "top.None") for op in top.ops) == 34


def _quantize(done, all_blocks, cwd):
    assert "warning" not in output_of(done, "--calibration_method=kl")  # 6 photos, no --input_num asked for more
    check_quoted(all_blocks, done, "--report=r18_int8.json")
    mixed = output_of(done, "--mixed_precision=0.9999,40")
    assert "mixed precision: keeping" in mixed and "reaches the target 0.9999,40.0 dB" in mixed
    assert "resnet18_like_1/stem_relu_1/Relu:0 (top.Conv): F16: quantize table" in mixed
    assert "a data move costs nothing to keep in float" in mixed
    report = output_of(done, 'json.load(open("r18_mixed.json"))')
    assert "F16" in report and "INT8" in report


def _deploy(done, all_blocks, cwd):
    check_quoted(all_blocks, done, "--trace=r18_int8.trace.json")
    s2d = output_of(done, "--space_to_depth --report=r18_s2d.json")
    assert "'applied': True" in s2d and "'first_conv_cycles': [614656, 200704]" in s2d
    # "the whole program 1,200 -> 778 us (1.54x)": the cycle model's estimates, without and with S2D
    before = re.search(r"estimated latency on npu1: ([\d,.]+) us", output_of(done, "--trace=r18_int8.trace.json"))
    assert round(float(before.group(1).replace(",", ""))) == 1200, before.group(0)
    after = re.search(r"^([\d.]+) [\d.]+ \d+ \d+$", s2d, re.M)   # the python's print: latency_us first
    assert after and round(float(after.group(1))) == 778, s2d


def _layout(done, all_blocks, cwd):
    grep = output_of(done, "grep -c")
    assert "face_nhwc.top.mlir:0" in grep and "face_nchw.top.mlir:5" in grep
    assert "permutes 102 -> 1" in output_of(done, "MobileNetV3Small(")
    assert "['canonicalize', 'convert-layout', 'space-to-depth']" in output_of(done, "print(sorted(registered()))")


def _train(done, all_blocks, cwd):
    assert "(None, 112, 112, 12)" in output_of(done, "s2d_model.input_shape")
    assert "2 S2D rewrites (one per replica)" in output_of(done, "strategy.run(")
    assert "declin" in output_of(done, "--target=cpu")


def _formats(done, all_blocks, cwd):
    assert "{'conv1': (4.3, -4.178, 4.493)}" in output_of(done, "CalibrationTable(")
    assert "{'resnet18_like_1/stem_relu_1/Relu:0': 'F16'}" in output_of(done, "read_qtable(")
    assert "npu1 64 16777216 ('F32', 'BF16', 'F16', 'INT8')" in output_of(done, "tftpu.chip.load(")
    container = output_of(done, "write_model_file(")
    assert "b'TPUMODEL' 1 0 2 64 64" in container and "[('meta', 192, 18), ('weights', 256, 100)]" in container


def _configuration(done, all_blocks, cwd):
    assert output_of(done, "npu2").split() == ["128", "128"]


def _datasets(done, all_blocks, cwd):
    assert "(224, 224, 3) uint8 6" in output_of(done, "datasets.image(")


def _tflite(done, all_blocks, cwd):
    assert "['int8', 'interpreter', 'space_to_depth', 'tac']" in output_of(done, "print(sorted(converter.report))")
    assert (cwd / "s2d.tflite").stat().st_size > 0 and (cwd / "m.json").stat().st_size > 0


CHECKS = {"guides/import.md": _import, "guides/quantize.md": _quantize, "guides/deploy.md": _deploy,
          "guides/layout.md": _layout, "guides/train-s2d.md": _train, "reference/formats.md": _formats,
          "reference/configuration.md": _configuration, "reference/datasets.md": _datasets,
          "guides/tflite.md": _tflite}


def test_markers_and_blocks():
    """Every not-run marker gives a reason; no block needs the clone's tests package; every page
    with checks has blocks to run."""
    for page in PAGES:
        all_blocks = blocks((DOCS / page).read_text(encoding="utf-8"))
        assert all(b.skip for b in all_blocks if b.skip is not None), page
        for b in runnable(all_blocks):
            assert "from tests" not in b.code and "tests.material" not in b.code, f"docs/{page}:{b.line}"
    assert set(CHECKS) <= set(RUNNABLE)


@pytest.fixture(scope="session")
def shared_prefixes(tmp_path_factory):
    """Leading blocks shared by pages, run once for all test workers (under pytest-xdist, the
    parent of a worker's temp root is the session's, common to its workers)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "docs-shared-prefixes"
    return SharedPrefixes({p: runnable(blocks((DOCS / p).read_text(encoding="utf-8"))) for p in RUNNABLE}, root)


def test_shared_prefixes(tmp_path):
    """Only the leading blocks two pages share byte for byte are shared: they run once (the second
    page gets their files and outputs), and the rest of each page runs in its own directory."""
    count = tmp_path / "count"
    page = f"# a\n\n```bash\necho one > f; echo ran >> {count}\n```\n\n```bash\necho {{}} >> f; cat f\n```\n"
    pages = {name: runnable(blocks(page.format(name))) for name in "ab"}
    pages["c"] = runnable(blocks(page.replace("one", "uno").format("c")))
    shared = SharedPrefixes(pages, tmp_path / "shared")
    for name in "abc":
        (tmp_path / name).mkdir()
        done = _run_blocks(pages[name], tmp_path / name, shared)
        assert done[-1].output == ("uno" if name == "c" else "one") + f"\n{name}\n"
    assert count.read_text() == "ran\nran\n"                       # once for a and b, once for c
    assert pages["b"][0].output == pages["a"][0].output and len(list((tmp_path / "shared").glob("*.json"))) == 1


def _run_blocks(todo, cwd, shared):
    env = environment()
    for block in todo[shared.restore(todo, cwd, env, "test"):]:
        run_block(block, cwd, env, "test")
    return todo


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE)
def test_page_blocks_run_as_pasted(page, tmp_path, shared_prefixes):
    done = run_page(DOCS / page, tmp_path, shared=shared_prefixes)
    all_blocks = blocks((DOCS / page).read_text(encoding="utf-8"))
    if page in CHECKS:
        CHECKS[page](done, all_blocks, tmp_path)


if __name__ == "__main__":
    for arg in sys.argv[1:] or [str(DOCS / p) for p in RUNNABLE]:
        with tempfile.TemporaryDirectory() as d:
            run_page(Path(arg), Path(d), verbose=True)
