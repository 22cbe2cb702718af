"""Every README block runs as pasted: in order, in one empty directory, with the venv on PATH.

The runner (tests/docs/markdown_blocks.py, shared with the docs pages' test) takes the ```bash and
```python blocks of README.md in order (the first bash block is the set-up that `.ci/run` runs;
it is not run here), runs each bash block with `bash -e` and each python block with the venv's
python, all in one temporary directory, and fails on the first block that fails, naming its
line. A python block whose first line is `# NAME.py` is a file the reader saves: it is written,
not run. `<!-- not-run: reason -->` just before a block leaves it out (only where it cannot run).
The figures the README quotes that are deterministic are checked against what the blocks print.
The README stays one screen or two: the guides live in docs/ (tests/docs/test_docs.py runs
theirs). By hand: `python -m tests.test_readme` prints each block's output.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import ROOT, agrees, blocks, output_of, run_page, runnable

README = ROOT / "README.md"


def run_all(cwd: Path, verbose: bool = False):
    """Every runnable README block, in order, in `cwd`."""
    return run_page(README, cwd, skip_setup=True, verbose=verbose)


def test_figures_agree_within_the_last_digit():
    out = "lowered: 34 INT8\n  Identity:0: cosine 0.999796, SQNR 33.4 dB\n"
    assert agrees("Identity:0: cosine 0.999795, SQNR 33.3 dB", out)
    assert not agrees("Identity:0: cosine 0.999792, SQNR 33.3 dB", out)
    assert not agrees("Identity:0: cosine 0.999795, SQNR 33.7 dB", out)
    assert agrees("lowered: 34 INT8", out) and not agrees("lowered: 33 INT8", out)
    assert agrees("SQNR 33.3 dB", out) and not agrees("SQNR 3.4 dB", out) and agrees("bit-exact", "bit-exact (1 s)")


def test_setup_block_and_markers():
    """The first bash block is the set-up: two commands (what .ci/run reads); no block needs the
    clone's tests package, and every not-run marker gives a reason."""
    all_blocks = blocks(README.read_text(encoding="utf-8"))
    first_bash = next(b for b in all_blocks if b.lang == "bash")
    setup = [ln for ln in first_bash.code.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(setup) == 2 and "pytest" in setup[1] and "tftpu-demo" in setup[0]
    assert all(b.lang not in ("bash", "python") for b in all_blocks[:all_blocks.index(first_bash)])
    for b in runnable(all_blocks, skip_setup=True):
        assert "from tests" not in b.code and "tests.material" not in b.code, f"README.md:{b.line}"
    assert all(b.skip for b in all_blocks if b.skip is not None)
    assert len(runnable(all_blocks, skip_setup=True)) >= 5     # a quick start per job


def test_readme_is_short_and_links_into_the_docs():
    """Under 150 lines; every relative link resolves; each job's guide is linked; the sections
    the docs include (`--8<-- "README.md:NAME"`) are marked."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local and all((ROOT / link).exists() for link in local), [l for l in local if not (ROOT / l).exists()]
    for guide in ("train-s2d", "import", "quantize", "deploy", "layout", "tac", "tflite"):
        assert f"docs/guides/{guide}.md" in local, guide
    assert "mkdocs build --strict" in text
    included = set()
    for page in (ROOT / "docs").rglob("*.md"):
        included |= set(re.findall(r'--8<-- "README\.md:(\w+)"', page.read_text(encoding="utf-8")))
    assert included >= {"setup", "what", "quickstart"}
    for name in included:
        assert text.count(f"<!-- --8<-- [start:{name}] -->") == 1 == text.count(f"<!-- --8<-- [end:{name}] -->"), name


def test_blocks_parse():
    text = "# t\n\n```bash\nsetup\n```\n\n## A\n<!-- not-run: needs a GPU -->\n```python\nx\n```\n```\nout\n```\n"
    found = blocks(text)
    assert [(b.lang, b.section, b.skip, b.line) for b in found] == [
        ("bash", "t", None, 3), ("python", "A", "needs a GPU", 9), ("", "A", None, 12)]
    assert runnable(found, skip_setup=True) == []


@pytest.mark.slow
def test_readme_blocks_run_as_pasted(tmp_path):
    done = run_all(tmp_path)
    # Figures and claims of the quick start, where they are deterministic.
    compiled = output_of(done, "tftpu.compile(")
    assert "<CompiledModel resnet18_like for npu1 in INT8" in compiled
    assert "simulator vs TPU inference: bit-exact ok" in compiled and "space-to-depth" in compiled
    assert "out.npz: 1 tensor(s)" in output_of(done, "tftpu-run --model=r18.tpumodel")
    import numpy as np

    assert np.load(tmp_path / "out.npz")["Identity:0"].shape == (1, 10)
    import h5py

    with h5py.File(tmp_path / "r18.weights.h5") as f:       # "kernels keep their shapes"
        shapes = []
        f.visititems(lambda name, obj: shapes.append(obj.shape) if hasattr(obj, "shape") else None)
    assert (7, 7, 3, 64) in shapes
    assert "['interpreter', 'space_to_depth', 'tac']" in output_of(done, "converter.report")
    assert "GPU: 36" in output_of(done, "tftpu-tac r18.tflite")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        run_all(Path(d), verbose=True)
