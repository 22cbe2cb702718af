"""Reference tables generated from the code at build time, so the pages cannot drift from it.

An mkdocs hook (mkdocs.yml: `hooks:`) that replaces marker lines in a page:
- `<!-- tools-reference -->`: one section per tool in tools/ (its docstring, then every flag it
  defines in absl: name, type, default, help);
- `<!-- exit-status -->`: the exit statuses of tftpu.errors (each exception class's `exit_code`);
- `<!-- bundled-configs -->`: the chip and TAC hardware files bundled in tftpu/configs/.
Run it alone to print the Markdown: `python docs/hooks/reference.py`.

Each tool is imported in its own process (tools may define flags of the same name, which one
absl flag registry refuses); importing a tool defines its flags and loads no TensorFlow.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS_MARKER = "<!-- tools-reference -->"
EXIT_MARKER = "<!-- exit-status -->"
CONFIGS_MARKER = "<!-- bundled-configs -->"

# Runs in a child process: import one tool by path, print its docstring and flags as JSON.
_DESCRIBE = r"""
import importlib.util, json, sys
from absl import flags
path, name = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
sys.modules[name] = module
spec.loader.exec_module(module)
described, seen = [], set()
# as `tftpu-X --help` lists them: every flag a non-absl module defined while the tool was imported
# (a tool's own, and those a helper such as tftpu.cli.define_dataset_flags defined for it)
by_module = flags.FLAGS.flags_by_module_dict()
for key in [name] + [m for m in by_module if m != name and not m.startswith("absl")]:
    for f in by_module.get(key, []):
        if f.name not in seen:
            seen.add(f.name)
            described.append({"name": f.name, "short_name": f.short_name, "type": f.flag_type(),
                              "boolean": bool(f.boolean), "default": f.default_as_str, "help": f.help,
                              "enum_values": list(getattr(f, "enum_values", None) or
                                                  getattr(getattr(f, "parser", None), "enum_values", None) or [])})
print(json.dumps({"doc": module.__doc__ or "", "flags": described}))
"""


def tool_paths() -> list[Path]:
    return sorted((ROOT / "tools").glob("tftpu_*.py"))


def describe(path: Path) -> dict:
    """A tool's docstring and flag definitions, read by importing it in a child process."""
    done = subprocess.run([sys.executable, "-c", _DESCRIBE, str(path), f"tftpu_tools.{path.stem}"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{path}: cannot read its flags:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def _docstring(doc: str) -> str:
    """A tool's docstring as Markdown: paragraphs as they are, its indented usage lines quoted as text."""
    out, usage = [], []
    paragraphs = inspect.cleandoc(doc).split("\n\n", 1)   # the first paragraph is the summary
    lines = paragraphs[1].splitlines() if len(paragraphs) > 1 else []
    for line in lines + [""]:
        if line.startswith("    "):
            usage.append(line[4:])
            continue
        if usage and not line.strip():
            out += ["", "```text", *usage, "```", ""]
            usage = []
            continue
        out.append(line.replace("*", "\\*"))
    return "\n".join(out).strip()


def flag_table(flags: list[dict]) -> str:
    rows = ["| flag | type | default | meaning |", "|---|---|---|---|"]
    for f in flags:
        spelt = f"-{f['name']}" if len(f["name"]) == 1 else f"--{f['name']}"
        if f["boolean"]:
            spelt = f"--[no]{f['name']}"
        if f["short_name"]:
            spelt += f", -{f['short_name']}"
        kind = f["type"].replace("string enum", "enum")
        if f["enum_values"]:
            kind += ": " + ", ".join(f"`{v}`" for v in f["enum_values"])
        default = (f["default"] or "").strip("'")
        default = f"`{default}`" if default not in ("", "None") else ""
        rows.append(f"| `{spelt}` | {kind} | {default} | {_cell(f['help'])} |")
    return "\n".join(rows)


def _summary(doc: str, command: str) -> str:
    """The docstring's first sentence, after `tftpu-X:`, capitalised."""
    title = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else command
    summary = title.split(":", 1)[1].strip() if title.startswith(command + ":") else title
    return summary[:1].upper() + summary[1:]


@functools.lru_cache(maxsize=1)
def tools_markdown() -> str:
    """A table of the tools, then a section per tool: its docstring and its flags."""
    table, sections = ["| command | job |", "|---|---|"], []
    for path in tool_paths():
        command = path.stem.replace("_", "-")
        info = describe(path)
        summary = _summary(info["doc"], command)
        table.append(f"| [`{command}`](#{command}) | {_cell(summary)} |")
        sections.append(f"## `{command}` {{#{command}}}\n\n{summary}\n\n{_docstring(info['doc'])}\n\n"
                        f"Flags (`{command} --help` prints the same):\n\n{flag_table(info['flags'])}\n")
    return "\n".join(table) + "\n\n" + "\n".join(sections)


@functools.lru_cache(maxsize=1)
def exit_status_markdown() -> str:
    """The exit statuses tftpu's typed errors carry, each with the classes that carry it."""
    sys.path.insert(0, str(ROOT))
    try:
        from tftpu import errors
    finally:
        sys.path.pop(0)
    by_code: dict[int, list[type]] = {}
    for _, cls in sorted(vars(errors).items()):
        if inspect.isclass(cls) and cls.__module__ == errors.__name__ and hasattr(cls, "exit_code"):
            by_code.setdefault(cls.exit_code, []).append(cls)
    rows = ["| status | meaning | raised as |", "|---|---|---|", "| 0 | success | |"]
    for code, classes in sorted(by_code.items()):
        # the meaning: the most general classes of the status (below TftpuError, the base of all)
        classes = [c for c in classes if c is not errors.TftpuError]
        roots = [c for c in classes if not any(b in classes for b in c.__mro__[1:])]
        meaning = " ".join(_cell(inspect.getdoc(c).split("\n\n")[0]) for c in roots)
        names = ", ".join(f"`tftpu.errors.{c.__name__}`" for c in sorted(classes, key=lambda c: c.__name__))
        rows.append(f"| {code} | {meaning} | {names} |")
    # tftpu.cli.run's own statuses for signals (KeyboardInterrupt, tftpu.errors.Terminated)
    rows.append("| 130 / 143 | interrupted by SIGINT / SIGTERM; temporary files are removed | "
                "`KeyboardInterrupt`, `tftpu.errors.Terminated` |")
    return "\n".join(rows)


def configs_markdown() -> str:
    """The bundled chip and TAC hardware files, each with its name and description."""
    import yaml

    rows = ["| kind | name | description |", "|---|---|---|"]
    for kind in ("chips", "hardware"):
        for path in sorted((ROOT / "tftpu" / "configs" / kind).glob("*.yaml")):
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            rows.append(f"| {kind} | `{data.get('name', path.stem)}` | {_cell(data.get('description', ''))} |")
    return "\n".join(rows)


MARKERS = {TOOLS_MARKER: tools_markdown, EXIT_MARKER: exit_status_markdown, CONFIGS_MARKER: configs_markdown}


def on_page_markdown(markdown: str, page, config, files) -> str:   # the mkdocs hook
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


if __name__ == "__main__":
    print(*(make() for make in MARKERS.values()), sep="\n\n")
