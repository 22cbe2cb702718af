"""Where a long job's time goes: named spans (thread, start, end) recorded while `recording()` is
active, turned into Chrome's trace-event JSON (one track per thread; chrome://tracing and
https://ui.perfetto.dev open it) or summed per name.

A compile runs its corrections on worker threads beside the builds and judgements on the main
one; the stage times it reports sum what each stage took, not what ran at once. The spans show
that, so time spent can be put where it goes. Off by default: `span` then costs one global read.

>>> with recording() as rec:
...     with span("outer"):
...         with span("inner", n=3):
...             pass
>>> sorted(rec.totals())
['inner', 'outer']
>>> [e["name"] for e in rec.chrome()["traceEvents"] if e["ph"] == "X"]
['outer', 'inner']
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

from tftpu.errors import InternalError
from tftpu.utils.files import atomic_write

__all__ = ["span", "recording", "Recording"]

_ACTIVE: list | None = None           # the events of the recording in progress, if any


class Recording:
    """The spans recorded: (name, thread name, start ns, end ns, args), in the order they ended."""

    def __init__(self):
        self.events: list[tuple[str, str, int, int, dict]] = []
        self.origin = time.perf_counter_ns()

    def totals(self) -> dict[str, float]:
        """Seconds per span name, summed over threads (a span inside another counts in both)."""
        out: dict[str, float] = {}
        for name, _, t0, t1, _ in self.events:
            out[name] = out.get(name, 0.0) + (t1 - t0) / 1e9
        return out

    def chrome(self) -> dict:
        """The spans as Chrome trace events ("X", microseconds from the start of the recording),
        each thread a track named after it, the main thread first; spans sorted by start (an
        outer span before the spans inside it)."""
        threads: dict[str, int] = {}
        for name in [threading.main_thread().name] + [e[1] for e in self.events]:
            threads.setdefault(name, len(threads) + 1)
        events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
                  for name, tid in threads.items()]
        for name, thread, t0, t1, args in sorted(self.events, key=lambda e: (e[2], -e[3])):
            event = {"name": name, "ph": "X", "pid": 1, "tid": threads[thread],
                     "ts": (t0 - self.origin) / 1e3, "dur": (t1 - t0) / 1e3}
            if args:
                event["args"] = {k: v if isinstance(v, (int, float, bool)) else str(v) for k, v in args.items()}
            events.append(event)
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path) -> None:
        """`chrome()` written to `path` (whole or not at all)."""
        with atomic_write(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome(), f, separators=(",", ":"))


@contextlib.contextmanager
def recording():
    """Record every `span` in this process (any thread) until the block ends: yields the `Recording`."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise InternalError("spans", "a recording is already in progress")
    rec = Recording()
    _ACTIVE = rec.events
    try:
        yield rec
    finally:
        _ACTIVE = None


@contextlib.contextmanager
def span(name: str, **args):
    """The block's time as one span named `name` (with `args` shown beside it), where a
    `recording()` is in progress; nothing otherwise."""
    events = _ACTIVE
    if events is None:
        yield
        return
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        events.append((name, threading.current_thread().name, t0, time.perf_counter_ns(), args))
