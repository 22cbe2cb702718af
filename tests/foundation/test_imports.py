"""Imports go one way: the layers of `.importlinter` hold and no module import cycle exists.

The contracts run with import-linter itself; the cycle check is grimp's import graph. Both are
shown to fail when a cycle or an upward import is added on purpose.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layers() -> list[set[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    lines = config["importlinter:contract:layers"]["layers"].split("\n")
    return [{m.strip() for m in line.split("|")} for line in lines if line.strip()]


def upward_imports(graph) -> list:
    return sorted((d.importer, d.imported) for d in graph.find_illegal_dependencies_for_layers(
        layers=[grimp.Layer(*sorted(layer)) for layer in layers()]))


def test_contracts_are_kept():
    done = subprocess.run([str(LINT), "--config", str(ROOT / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_import_cycles():
    assert cycles(grimp.build_graph("tftpu")) == []


def test_an_added_cycle_and_an_upward_import_are_caught():
    graph = grimp.build_graph("tftpu")
    assert upward_imports(graph) == []
    graph.add_import(importer="tftpu.ir.attrs", imported="tftpu.transforms.canonicalize")
    assert any("tftpu.ir.attrs" in c for c in cycles(graph))
    assert upward_imports(graph)


def test_lint_imports_fails_on_a_real_upward_import(tmp_path):
    shutil.copytree(ROOT / "tftpu", tmp_path / "tftpu", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "tftpu" / "ir" / "attrs.py", "a") as f:
        f.write("\nimport tftpu.transforms.canonicalize  # noqa: E402  (a deliberate upward import)\n")
    done = subprocess.run([str(LINT), "--config", ".importlinter", "--no-cache"], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "BROKEN" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tftpu.ir.attrs -> tftpu.transforms.canonicalize" in done.stdout
