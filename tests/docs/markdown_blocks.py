"""Run the code blocks of a Markdown page as a reader pastes them: in order, in one empty directory.

Shared by tests/test_readme.py (README.md) and tests/docs/test_docs.py (every page under docs/).

- ```bash blocks run with `bash -e -o pipefail`, ```python blocks with the venv's python, all in
  one directory, with the venv on PATH; the first failing block fails the page, naming its line.
- A ```python block whose first line is `# NAME.py` is a file the reader saves: written, not run.
- Any other language (```text, ```yaml, a plain ```) is shown, never run: a plain or ```text block
  right after a code block is that block's output as the page quotes it (`quoted_after`).
- `<!-- not-run: reason -->` on the line before a block leaves it out; the reason is required, and
  the page must also say it in its text (the marker itself does not show on a rendered page).
- Figures a page quotes are compared with what its blocks print by `agrees`: a figure with
  decimals within two units of its last quoted digit (a float reference rounds differently
  between CPUs), every other figure exact.
- Leading blocks that several pages share byte for byte (`SharedPrefixes`: deploy.md and
  quantize.md both start by building the same TOP model and calibration table) run once per
  test session, in an empty directory of their own, as pasted; each page then starts from a copy
  of what they left there, with their outputs. A failure in them fails every page that has them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def runnable(all_blocks: list[Block], skip_setup: bool = False) -> list[Block]:
    """The blocks a page runs: bash/python, not marked not-run (the README's first bash block is
    the set-up that .ci/run runs: `skip_setup` leaves it out)."""
    code = [b for b in all_blocks if b.lang in ("bash", "python")]
    return [b for b in code[1 if skip_setup else 0:] if not b.skip]


def environment() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TFTPU_VERBOSE", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str], where: str = "README.md",
              timeout: float = 900) -> None:
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
    assert done.returncode == 0, (f"{where}:{block.line} ({block.section}): the {block.lang} block exits "
                                  f"{done.returncode}:\n{block.code}\n--- output ---\n{block.output[-4000:]}")


def prefix_key(todo: list[Block]) -> str:
    """A name for a run of blocks: their languages and code, in order."""
    digest = hashlib.sha256()
    for b in todo:
        digest.update(f"{b.lang}\0{b.code}\0".encode())
    return digest.hexdigest()[:20]


class SharedPrefixes:
    """The leading blocks that two or more of `pages` (name -> runnable blocks) share byte for
    byte run once under `root` (one directory per run of blocks; a lock file makes test workers
    that share `root` wait for the one running them); `restore` copies what they left into a
    page's directory and gives the page's blocks their outputs."""

    def __init__(self, pages: dict[str, list[Block]], root: Path):
        counts = Counter(prefix_key(todo[:k]) for todo in pages.values() for k in range(1, len(todo) + 1))
        self.shared = {key for key, n in counts.items() if n > 1}
        self.root = root

    def restore(self, todo: list[Block], cwd: Path, env: dict[str, str], where: str) -> int:
        """How many leading blocks of `todo` are done in `cwd` (0: none is shared)."""
        k = max((k for k in range(1, len(todo) + 1) if prefix_key(todo[:k]) in self.shared), default=0)
        if not k:
            return 0
        key = prefix_key(todo[:k])
        ran, outputs = self.root / key, self.root / f"{key}.json"
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not outputs.exists():
                shutil.rmtree(ran, ignore_errors=True)     # an earlier attempt that failed
                ran.mkdir()
                for block in todo[:k]:
                    run_block(block, ran, env, where)
                outputs.write_text(json.dumps([b.output for b in todo[:k]]))
        for block, output in zip(todo[:k], json.loads(outputs.read_text())):
            block.output = output
        shutil.copytree(ran, cwd, dirs_exist_ok=True)
        return k


def run_page(path: Path, cwd: Path, skip_setup: bool = False, verbose: bool = False,
             shared: SharedPrefixes | None = None) -> list[Block]:
    """Every runnable block of the page at `path`, in order, in `cwd` (those `shared` has run
    already: copied from where they ran)."""
    path = path.resolve()
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    todo, env = runnable(blocks(path.read_text(encoding="utf-8")), skip_setup), environment()
    start = shared.restore(todo, cwd, env, where) if shared is not None else 0
    for block in todo[start:]:
        if verbose:
            print(f"--- {where}:{block.line} ({block.section}) ---", flush=True)
        run_block(block, cwd, env, where)
        if verbose:
            print(block.output, flush=True)
    return todo


def output_of(done: list[Block], needle: str) -> str:
    """The output of the block whose code holds `needle`."""
    found = [b for b in done if needle in b.code]
    assert len(found) == 1, f"{len(found)} blocks hold {needle!r}"
    return found[0].output


def quoted_after(all_blocks: list[Block], needle: str) -> list[str]:
    """The lines of the plain (or ```text) block that follows the code block holding `needle`:
    its output as the page quotes it."""
    i = next(i for i, b in enumerate(all_blocks) if needle in b.code)
    quoted = all_blocks[i + 1]
    assert quoted.lang in ("", "text"), f"line {quoted.line}: expected the quoted output block"
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


def check_quoted(all_blocks: list[Block], done: list[Block], needle: str) -> None:
    """Every line the page quotes after the block holding `needle` agrees with what it printed."""
    printed = output_of(done, needle)
    for line in quoted_after(all_blocks, needle):
        assert agrees(line, printed), f"the page quotes {line!r}; the block printed:\n{printed}"
