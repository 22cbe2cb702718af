"""When each command of a compiled program runs on the chip's engines, and a trace to look at it.

The chip overlaps moving data with computing on it: TPU-MLIR's GDMA engine loads and stores
between DDR and local memory while its TIU engine computes on what is already loaded, and sync
ids make a command wait for earlier commands of the other engine. This models that: each engine
("dma", "tiu", perhaps "host") runs its own commands in list order, one at a time, and a command
starts once its engine is free and every command it depends on has ended. The latency is where
the last command ends; how much of the DMA time hides behind compute is `overlap`.

`chrome_trace` turns a schedule into Chrome's trace-event JSON (one track per engine), which
chrome://tracing and https://ui.perfetto.dev open.

>>> slots = schedule([{"engine": "dma", "cycles": 100, "deps": ()},
...                   {"engine": "tiu", "cycles": 300, "deps": (0,)},
...                   {"engine": "dma", "cycles": 100, "deps": ()}])
>>> [(s.engine, s.start, s.end) for s in slots]
[('dma', 0, 100), ('tiu', 100, 400), ('dma', 100, 200)]
>>> latency(slots), busy(slots), overlap(slots)
(400, {'dma': 200, 'tiu': 300}, 0.5)
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Mapping

from tftpu.errors import InternalError
from tftpu.utils.files import atomic_write

__all__ = ["Slot", "schedule", "latency", "busy", "overlap", "chrome_trace", "write_trace"]

_ENGINE_ORDER = ("dma", "tiu", "host")
_PID = 1


@dataclasses.dataclass(frozen=True)
class Slot:
    """One command on the timeline: its index in the program, its engine, and when it runs (cycles)."""

    index: int
    engine: str
    start: int
    end: int


def _field(command, key: str, default=None):
    """`command[key]` for a mapping, `command.key` otherwise; `default` when it has none."""
    if isinstance(command, Mapping):
        return command.get(key, default)
    return getattr(command, key, default)


def _cycles(i: int, command) -> int:
    value = _field(command, "cycles")
    try:
        cycles = operator.index(value)
    except TypeError:
        raise InternalError("schedule", f"command {i}: cycles {value!r} is not an integer") from None
    if cycles < 0:
        raise InternalError("schedule", f"command {i}: negative cycles {cycles}")
    return cycles


def _engine(i: int, command) -> str:
    engine = _field(command, "engine")
    if not isinstance(engine, str) or not engine:
        raise InternalError("schedule", f"command {i}: engine {engine!r} is not a name")
    return engine


def _deps_end(i: int, command, ends: list) -> int:
    """When the last of command `i`'s dependencies ends (0 for none); each must be an earlier command."""
    ready = 0
    for d in _field(command, "deps", ()) or ():
        try:
            d = operator.index(d)
        except TypeError:
            raise InternalError("schedule", f"command {i}: dependency {d!r} is not an index") from None
        if not 0 <= d < i:
            raise InternalError("schedule", f"command {i}: dependency {d} is not an earlier command")
        if ends[d] > ready:
            ready = ends[d]
    return ready


def schedule(commands) -> list[Slot]:
    """Slots of `commands` (objects or dicts with `engine`, `cycles` and `deps`, the indices of
    earlier commands it waits for): a command starts when its engine's previous command in list
    order has ended and all its deps have ended."""
    free: dict[str, int] = {}
    ends: list[int] = []
    slots: list[Slot] = []
    for i, command in enumerate(commands):
        engine = _engine(i, command)
        cycles = _cycles(i, command)
        start = max(free.get(engine, 0), _deps_end(i, command, ends))
        end = start + cycles
        free[engine] = end
        ends.append(end)
        slots.append(Slot(i, engine, start, end))
    return slots


def latency(slots) -> int:
    """Cycles until the last slot ends (0 for none)."""
    return max((s.end for s in slots), default=0)


def busy(slots) -> dict[str, int]:
    """Cycles each engine spends running commands."""
    out: dict[str, int] = {}
    for s in slots:
        out[s.engine] = out.get(s.engine, 0) + s.end - s.start
    return out


def overlap(slots) -> float:
    """Share of the DMA time hidden behind other engines' work: (total busy - latency) / DMA busy,
    within [0, 1]; 0 without DMA."""
    per_engine = busy(slots)
    dma = per_engine.get("dma", 0)
    if not dma:
        return 0.0
    return min(1.0, max(0.0, (sum(per_engine.values()) - latency(slots)) / dma))


def _engines(slots) -> list[str]:
    """Engines present, dma, tiu and host first, the others sorted."""
    present = {s.engine for s in slots}
    return [e for e in _ENGINE_ORDER if e in present] + sorted(present - set(_ENGINE_ORDER))


def _metadata(name: str, engines: list) -> list[dict]:
    events = [{"ph": "M", "name": "process_name", "pid": _PID, "tid": 0, "args": {"name": name}}]
    for k, engine in enumerate(engines):
        tid = k + 1
        events.append({"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid, "args": {"name": engine}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": tid, "args": {"sort_index": k}})
    return events


def _label(i: int, command, engine: str, labels) -> str:
    if labels is not None:
        return str(labels[i])
    name = _field(command, "name")
    return str(name) if name is not None else f"{engine}#{i}"


def chrome_trace(commands, slots, frequency_hz: float, *, name: str = "tpumodel", labels=None) -> dict:
    """Chrome's trace-event JSON object for `slots` of `commands`: one process `name`, one thread
    per engine, one complete event per command with its times in microseconds at `frequency_hz`."""
    commands = list(commands)
    slots = list(slots)
    if len(commands) != len(slots):
        raise InternalError("chrome_trace", f"{len(commands)} commands but {len(slots)} slots")
    if labels is not None and len(labels) != len(commands):
        raise InternalError("chrome_trace", f"{len(commands)} commands but {len(labels)} labels")
    if not frequency_hz > 0:
        raise InternalError("chrome_trace", f"frequency {frequency_hz!r} Hz is not positive")
    engines = _engines(slots)
    tids = {e: k + 1 for k, e in enumerate(engines)}
    us = 1e6 / frequency_hz
    events = _metadata(name, engines)
    for s in slots:
        command = commands[s.index]
        args = dict(_field(command, "args") or {})
        args.update(index=s.index, cycles=s.end - s.start)
        events.append({"ph": "X", "name": _label(s.index, command, s.engine, labels), "cat": s.engine,
                       "pid": _PID, "tid": tids[s.engine], "ts": round(s.start * us, 6),
                       "dur": round((s.end - s.start) * us, 6), "args": args})
    other = {"frequency_hz": frequency_hz, "cycles": latency(slots), "commands": len(slots),
             "busy_cycles": busy(slots), "overlap": round(overlap(slots), 6)}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def _plain(value):
    """numpy scalars and arrays in `args` as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_trace(path, commands, slots, frequency_hz, *, name: str = "tpumodel", labels=None) -> None:
    """Write `chrome_trace(...)` to `path` as deterministic JSON: the same input gives the same bytes."""
    trace = chrome_trace(commands, slots, frequency_hz, name=name, labels=labels)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(trace, sort_keys=True, separators=(",", ":"), default=_plain))
