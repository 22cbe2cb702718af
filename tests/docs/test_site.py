"""The documentation site builds with warnings as errors, and its pages open in a browser cleanly.

`mkdocs build --strict` (broken links and anchors, pages left out of the navigation, API names
that do not resolve are errors) into a temporary directory; the tools' reference it generates
lists every flag each tool defines; and the quick start and a guide, served over HTTP on the
loopback, open in headless Chromium (Debian's `chromium`, which .ci/run installs) without a
console error, each leaving a screenshot. Without /usr/bin/chromium the browser tests skip and
say so; nothing else skips.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs import chromium
from tests.docs.markdown_blocks import ROOT

# docs/hooks/reference.py: the generator the site's build runs (an mkdocs hook, not a package)
_spec = importlib.util.spec_from_file_location("reference", ROOT / "docs" / "hooks" / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

NO_CHROMIUM = "chromium is not installed (/usr/bin/chromium; .ci/run installs Debian's package): browser test not run"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    assert "WARNING" not in done.stderr, done.stderr[-6000:]
    return out


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (a browser's search and fetches need http, not file)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_site_builds_with_every_page(site):
    for page in ROOT.joinpath("docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").with_suffix("")
        html = site / ("index.html" if rel.name == "index" else rel / "index.html")
        assert html.is_file(), f"{page} was not built"
    quick = re.sub(r"<[^>]+>", "", (site / "quickstart" / "index.html").read_text(encoding="utf-8"))
    assert "tftpu.compile(" in quick and "pytest -q -n 2" in quick     # the README parts it includes
    assert "--8&lt;--" not in quick and "--8<--" not in quick
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert api.count('class="doc doc-object') >= 20                        # mkdocstrings rendered the API


def test_tools_reference_lists_every_flag(site):
    """The generated page holds every tool and every flag its `--help` lists, with the exit statuses."""
    page = (site / "reference" / "tools" / "index.html").read_text(encoding="utf-8")
    assert "<!-- tools-reference -->" not in page and "<!-- exit-status -->" not in page
    for path in reference.tool_paths():
        assert f"<code>{path.stem.replace('_', '-')}</code>" in page
        usage = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True,
                               timeout=120)
        listed = re.findall(r"^\s+(-{1,2}(?:\[no\])?\w+):", usage.stdout, re.M)
        assert usage.returncode == 0 and (listed or path.stem == "tftpu_demo"), (path, usage.stderr[-2000:])
        described = {f["name"] for f in reference.describe(path)["flags"]}
        for spelt in listed:
            name = spelt.lstrip("-").removeprefix("[no]")
            assert name in described and f"<code>{spelt}" in page, (path.stem, spelt)
    for status in ("ToleranceError", "UsageError", "ModelFileError", "InternalError", "130 / 143"):
        assert status in page


def test_flag_table_marks_booleans_enums_and_defaults():
    table = reference.flag_table([
        {"name": "simulate", "short_name": None, "type": "bool", "boolean": True, "default": "'true'",
         "help": "a | b", "enum_values": []},
        {"name": "o", "short_name": None, "type": "string", "boolean": False, "default": None, "help": "<out>",
         "enum_values": []},
        {"name": "quantize", "short_name": "q", "type": "string enum", "boolean": False, "default": "'F32'",
         "help": "mode", "enum_values": ["F32", "INT8"]}])
    rows = table.splitlines()[2:]
    assert rows[0] == "| `--[no]simulate` | bool | `true` | a \\| b |"
    assert rows[1] == "| `-o` | string |  | &lt;out> |"
    assert rows[2] == "| `--quantize, -q` | enum: `F32`, `INT8` | `F32` | mode |"


@pytest.mark.skipif(not chromium.available(), reason=NO_CHROMIUM)
@pytest.mark.parametrize("path, title", [("quickstart/", "Quick start - tftpu"),
                                         ("guides/deploy/", "Deploy to a chip and the backend - tftpu"),
                                         ("reference/tools/", "Command-line tools - tftpu")])
def test_page_opens_without_console_errors(served, path, title, tmp_path):
    with chromium.Browser() as browser:
        page = browser.open(f"{served}/{path}", tmp_path / "page.png")
    assert page.errors == [], f"{path}: console errors: {page.errors}"
    assert page.title == title
    png = page.screenshot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000, "the screenshot is blank"


@pytest.mark.skipif(not chromium.available(), reason=NO_CHROMIUM)
def test_console_errors_are_caught(served, site):
    """The check above would see an error: a page with one of each kind reports all of them."""
    (site / "broken.html").write_text("<html><head><title>broken</title></head><body>"
                                      "<script>console.error('boom'); notDefined();</script>"
                                      "<img src='missing.png'></body></html>")
    with chromium.Browser() as browser:
        page = browser.open(f"{served}/broken.html")
    text = "\n".join(page.errors)
    assert "console.error: boom" in text and "notDefined" in text and "missing.png" in text, text
