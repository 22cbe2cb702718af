"""Open pages in headless Chromium and collect what a person's browser console would show.

Chromium (Debian's `chromium` package) is driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: commands on fd 3, replies and events on fd 4, each a JSON message
ended by a NUL byte), so no driver, websocket client or browser download is needed. For each
page it records uncaught exceptions (`Runtime.exceptionThrown`), `console.error` / `console.assert`
calls (`Runtime.consoleAPICalled`) and the browser's own error entries (`Log.entryAdded`: a
resource that failed to load, a blocked request, ...), and saves a PNG screenshot.

    with Browser() as browser:
        page = browser.open("http://127.0.0.1:8000/", "shot.png")
        assert not page.errors, page.errors
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900"]


def available() -> bool:
    return os.access(CHROMIUM, os.X_OK)


@dataclasses.dataclass
class Page:
    url: str
    title: str
    errors: list[str]
    screenshot: Path | None


class Browser:
    """One headless Chromium for the pages of a test; `open(url)` loads one in a fresh tab."""

    def __init__(self, executable: str = CHROMIUM, timeout: float = 60):
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="tftpu-chromium-")
        to_browser, self._out = os.pipe()
        self._in, from_browser = os.pipe()
        # The browser must see the pipes as fds 3 and 4: a shell moves them there, then execs it.
        command = " ".join([executable, *FLAGS, f"--user-data-dir={self._profile}",
                            "--remote-debugging-pipe", "about:blank"])
        self._proc = subprocess.Popen(["bash", "-c", f"exec {command} 3<&{to_browser} 4>&{from_browser}"],
                                      pass_fds=(to_browser, from_browser), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self._events = b"", 0, []

    # -- the protocol ---------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict | None:
        """The next message, or None once `deadline` (time.monotonic) has passed."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited: {self._stderr()}")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send a command and wait for its reply; events that arrive meanwhile are kept."""
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._receive(deadline)
            if message is None:
                raise TimeoutError(f"chromium did not answer {method} in {self.timeout} s")
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _stderr(self) -> str:
        self._proc.poll()
        return "" if self._proc.returncode is None else self._proc.stderr.read().decode(errors="replace")[-2000:]

    # -- pages ----------------------------------------------------------------------------------
    def open(self, url: str, screenshot: Path | None = None, settle: float = 1.5) -> Page:
        """Load `url` in a new tab, wait for its load event and `settle` seconds more (scripts
        that run after load), and return its title and every error its console showed."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self._events.clear()
        self.call("Page.navigate", {"url": url}, session=session)
        deadline, loaded = time.monotonic() + self.timeout, None
        if any(_loaded(m, session) for m in self._events):
            loaded = time.monotonic()
        while True:
            now = time.monotonic()
            if loaded is not None and now >= loaded + settle:
                break
            message = self._receive(min(deadline, loaded + settle) if loaded is not None else deadline)
            if message is None:
                if loaded is None:
                    raise TimeoutError(f"{url} did not finish loading in {self.timeout} s")
                continue
            self._events.append(message)
            if _loaded(message, session):
                loaded = time.monotonic()
        errors = [e for e in (_error(m) for m in self._events if m.get("sessionId") == session) if e]
        title = self.call("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                          session=session)["result"].get("value", "")
        if screenshot is not None:
            shot = self.call("Page.captureScreenshot", {"format": "png"}, session=session)
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        self.call("Target.closeTarget", {"targetId": target})
        return Page(url, title, errors, Path(screenshot) if screenshot else None)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send("Browser.close")
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _loaded(message: dict, session: str) -> bool:
    return message.get("method") == "Page.loadEventFired" and message.get("sessionId") == session


def _error(message: dict) -> str | None:
    """The console error an event stands for, as one line; None for anything else."""
    method, params = message.get("method"), message.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        text = details.get("exception", {}).get("description") or details.get("text", "")
        return f"uncaught exception: {text.splitlines()[0] if text else details}"
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        return f"console.{params['type']}: {args}"
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"{entry.get('source', 'browser')}: {entry.get('text', '')} {entry.get('url', '')}".strip()
    return None
