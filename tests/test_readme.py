"""Every README block runs as pasted: in order, in one empty directory, with the venv on PATH.

The runner takes the ```bash and ```python blocks of README.md in order (the first bash block is
the set-up that `.ci/run` runs; it is not run here), runs each bash block with `bash -e` and each
python block with the venv's python, all in one temporary directory, and fails on the first block
that fails, naming its line. A python block whose first line is `# NAME.py` is a file the reader
saves: it is written, not run. `<!-- not-run: reason -->` just before a block leaves it out (only
where it cannot run). The figures the README quotes that are deterministic are checked against
what the blocks print (a figure measured against a float reference within two units of its last
quoted digit: `agrees`). By hand: `python tests/test_readme.py` prints each block's output.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Sections whose blocks this test leaves out, with the reason (kept short, and said in the report).
LEFT_OUT_SECTIONS: dict[str, str] = {}      # section title -> why its blocks cannot run as pasted


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    section: str
    skip: str | None  # the reason of a <!-- not-run: ... --> before it
    output: str = ""


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text (any language), in order."""
    found, section, lines, i = [], "", text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"#{1,6} ", line):
            section = line.lstrip("#").strip()
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            j = i + 1
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            skip = re.match(r"<!--\s*not-run:\s*(.*?)\s*-->", lines[k].strip()) if k >= 0 else None
            found.append(Block(fence.group(1), "\n".join(lines[i + 1:j]) + "\n", i + 1, section,
                               skip.group(1) if skip else None))
            i = j
        i += 1
    return found


def runnable(all_blocks: list[Block]) -> list[Block]:
    """The blocks this test runs: bash/python, after the set-up block, not marked or left out."""
    code = [b for b in all_blocks if b.lang in ("bash", "python")]
    return [b for b in code[1:] if not b.skip and b.section not in LEFT_OUT_SECTIONS]


def environment() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TFTPU_VERBOSE", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str], timeout: float = 900) -> None:
    """Run one block in `cwd`; its stdout and stderr go to `block.output`; failure: AssertionError."""
    first = block.code.splitlines()[0] if block.code.strip() else ""
    saved = re.match(r"#\s*([\w.-]+\.py)\s*$", first) if block.lang == "python" else None
    if saved:
        (cwd / saved.group(1)).write_text(block.code)
        return
    cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code] if block.lang == "bash" else \
        [str(Path(sys.executable).parent / "python"), "-c", block.code]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    block.output = done.stdout + done.stderr
    assert done.returncode == 0, (f"README.md:{block.line} ({block.section}): the {block.lang} block exits "
                                  f"{done.returncode}:\n{block.code}\n--- output ---\n{block.output[-4000:]}")


def run_all(cwd: Path, verbose: bool = False) -> list[Block]:
    """Every runnable README block, in order, in `cwd`."""
    todo, env = runnable(blocks(README.read_text(encoding="utf-8"))), environment()
    for block in todo:
        if verbose:
            print(f"--- README.md:{block.line} ({block.section}) ---", flush=True)
        run_block(block, cwd, env)
        if verbose:
            print(block.output, flush=True)
    return todo


def output_of(done: list[Block], needle: str) -> str:
    """The output of the block whose code holds `needle`."""
    found = [b for b in done if needle in b.code]
    assert len(found) == 1, f"{len(found)} README blocks hold {needle!r}"
    return found[0].output


def quoted_after(all_blocks: list[Block], needle: str) -> list[str]:
    """The lines of the plain ``` block that follows the code block holding `needle` (quoted output)."""
    i = next(i for i, b in enumerate(all_blocks) if needle in b.code)
    quoted = all_blocks[i + 1]
    assert quoted.lang == "", f"README.md:{quoted.line}: expected the quoted output block"
    return [ln.strip() for ln in quoted.code.splitlines() if ln.strip()]


_FIGURE = re.compile(r"-?\d+(?:\.\d+)?")


def agrees(quoted: str, printed: str) -> bool:
    """Whether `printed` holds the `quoted` text, each figure with decimals within two units of its
    last quoted digit (figures measured against a float reference can differ there between CPUs,
    whose float kernels round differently) and every other figure exact."""
    figures = _FIGURE.findall(quoted)
    pattern = f"({_FIGURE.pattern})".join(map(re.escape, _FIGURE.split(quoted)))
    for m in re.finditer(pattern, printed):
        got = m.groups() if figures else ()
        if all(q == g if "." not in q else abs(float(q) - float(g)) <= 2.000001 * 10.0 ** -len(q.split(".")[1])
               for q, g in zip(figures, got)):
            return True
    return False


def test_figures_agree_within_the_last_digit():
    out = "lowered: 34 INT8\n  Identity:0: cosine 0.999796, SQNR 33.4 dB\n"
    assert agrees("Identity:0: cosine 0.999795, SQNR 33.3 dB", out)
    assert not agrees("Identity:0: cosine 0.999792, SQNR 33.3 dB", out)
    assert not agrees("Identity:0: cosine 0.999795, SQNR 33.7 dB", out)
    assert agrees("lowered: 34 INT8", out) and not agrees("lowered: 33 INT8", out)
    assert agrees("SQNR 33.3 dB", out) and not agrees("SQNR 3.4 dB", out) and agrees("bit-exact", "bit-exact (1 s)")


def test_setup_block_and_markers():
    """The set-up block is two commands (what .ci/run reads); no block needs the clone's tests package,
    and every not-run marker gives a reason."""
    all_blocks = blocks(README.read_text(encoding="utf-8"))
    setup = [ln for ln in all_blocks[0].code.splitlines() if ln.strip() and not ln.startswith("#")]
    assert all_blocks[0].lang == "bash" and len(setup) == 2 and "pytest" in setup[1]
    for b in runnable(all_blocks):
        assert "from tests" not in b.code and "tests.material" not in b.code, f"README.md:{b.line}"
    assert all(b.skip for b in all_blocks if b.skip is not None)
    assert len(runnable(all_blocks)) >= 15


def test_blocks_parse():
    text = "# t\n\n```bash\nsetup\n```\n\n## A\n<!-- not-run: needs a GPU -->\n```python\nx\n```\n```\nout\n```\n"
    found = blocks(text)
    assert [(b.lang, b.section, b.skip, b.line) for b in found] == [
        ("bash", "t", None, 3), ("python", "A", "needs a GPU", 9), ("", "A", None, 12)]
    assert runnable(found) == []


@pytest.mark.slow
def test_readme_blocks_run_as_pasted(tmp_path):
    done = run_all(tmp_path)
    all_blocks = blocks(README.read_text(encoding="utf-8"))
    # Figures the README quotes, where they are deterministic.
    import onnx

    assert len(onnx.load(tmp_path / "m.onnx").graph.node) == 51  # "51 ONNX nodes -> 34 TOP ops"
    assert "77 ops" in output_of(done, "--model_def=m.onnx")
    from tftpu import ir

    top = ir.load(tmp_path / "m.top.mlir")
    assert sum(op.name not in ("top.Input", "top.Weight", "top.None") for op in top.ops) == 34
    assert "warning" not in output_of(done, "--calibration_method=kl")  # 6 photos, no --input_num asked for more
    deploy = output_of(done, "--tpu_mlir=r18_int8.tpu.mlir")
    for line in quoted_after(all_blocks, "--tpu_mlir=r18_int8.tpu.mlir"):
        assert agrees(line, deploy), f"README quotes {line!r}; tftpu-deploy printed:\n{deploy}"
    grep = output_of(done, "grep -c")
    assert "face_nhwc.top.mlir:0" in grep and "face_nchw.top.mlir:5" in grep
    assert "permutes 102 -> 1" in output_of(done, "MobileNetV3Small(")
    assert "(None, 112, 112, 12)" in output_of(done, "s2d_model.input_shape")
    assert "['canonicalize', 'convert-layout', 'space-to-depth']" in output_of(done, "print(sorted(registered()))")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        run_all(Path(d), verbose=True)
