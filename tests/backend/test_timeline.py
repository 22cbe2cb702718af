"""The timeline of a command list: engines run their commands in order, a command waits for its
dependencies, DMA overlaps compute; and its Chrome trace opens in chrome://tracing and Perfetto."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu.backend.timeline import Slot, busy, chrome_trace, latency, overlap, schedule, write_trace
from tftpu.errors import InternalError


@dataclasses.dataclass
class Command:
    engine: str
    cycles: int
    deps: tuple = ()
    name: str | None = None


def cmd(engine, cycles, *deps, **extra):
    return {"engine": engine, "cycles": cycles, "deps": deps, **extra}


def spans(slots):
    return [(s.engine, s.start, s.end) for s in slots]


def test_load_compute_store_overlap():
    # load 0, compute 0 on it, load 1 while computing, compute 1, store each result after its compute
    commands = [cmd("dma", 100), cmd("tiu", 300, 0), cmd("dma", 100), cmd("tiu", 300, 2),
                cmd("dma", 50, 1), cmd("dma", 50, 3)]
    slots = schedule(commands)
    assert spans(slots) == [("dma", 0, 100), ("tiu", 100, 400), ("dma", 100, 200), ("tiu", 400, 700),
                            ("dma", 400, 450), ("dma", 700, 750)]
    assert [s.index for s in slots] == list(range(6))
    assert latency(slots) == 750
    assert busy(slots) == {"dma": 300, "tiu": 600}
    # (900 - 750) / 300: half of the DMA time hidden behind compute
    assert overlap(slots) == pytest.approx(0.5)


def test_engine_order_and_dependency_chain():
    # a chain across engines serialises everything; the engine's own order holds even without deps
    chain = schedule([cmd("dma", 10), cmd("tiu", 20, 0), cmd("host", 5, 1), cmd("dma", 7, 2)])
    assert spans(chain) == [("dma", 0, 10), ("tiu", 10, 30), ("host", 30, 35), ("dma", 35, 42)]
    assert overlap(chain) == 0.0
    ordered = schedule([cmd("tiu", 50), cmd("dma", 10), cmd("tiu", 5, 1), cmd("tiu", 5)])
    assert spans(ordered) == [("tiu", 0, 50), ("dma", 0, 10), ("tiu", 50, 55), ("tiu", 55, 60)]
    # a command waits for the latest of several deps
    fan_in = schedule([cmd("dma", 10), cmd("tiu", 40), cmd("host", 1, 0, 1)])
    assert fan_in[2].start == 40


def test_objects_zero_cycles_and_empty():
    slots = schedule([Command("dma", 0), Command("tiu", 3, (0,)), Command("tiu", 0, (1,))])
    assert slots == [Slot(0, "dma", 0, 0), Slot(1, "tiu", 0, 3), Slot(2, "tiu", 3, 3)]
    assert schedule([]) == [] and latency([]) == 0 and busy([]) == {} and overlap([]) == 0.0
    # deps may be left out; a DMA-only program hides nothing
    only_dma = schedule([{"engine": "dma", "cycles": 4}, {"engine": "dma", "cycles": 4}])
    assert latency(only_dma) == 8 and overlap(only_dma) == 0.0
    # DMA wholly under compute
    assert overlap(schedule([cmd("tiu", 100), cmd("dma", 30)])) == 1.0


@pytest.mark.parametrize("deps", [(1,), (2,), (-1,), (0.5,), ("0",)])
def test_bad_dependency_is_an_internal_error(deps):
    with pytest.raises(InternalError, match="command 1"):
        schedule([cmd("dma", 1), cmd("tiu", 1, *deps), cmd("dma", 1)])


@pytest.mark.parametrize("bad", [{"engine": "tiu", "cycles": -1}, {"engine": "tiu", "cycles": 1.5},
                                 {"engine": "tiu"}, {"engine": None, "cycles": 1}])
def test_bad_command_is_an_internal_error(bad):
    with pytest.raises(InternalError, match="schedule: command 1"):
        schedule([cmd("dma", 1), bad])


@st.composite
def programs(draw):
    n = draw(st.integers(0, 40))
    out = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        out.append(cmd(draw(st.sampled_from(["dma", "tiu", "host"])), draw(st.integers(0, 1000)), *deps))
    return out


@settings(max_examples=200, deadline=None)
@given(programs())
def test_schedule_properties(commands):
    slots = schedule(commands)
    assert len(slots) == len(commands)
    last: dict[str, Slot] = {}
    for s, c in zip(slots, commands):
        assert s.engine == c["engine"] and s.end - s.start == c["cycles"] and s.start >= 0
        deps_end = max((slots[d].end for d in c["deps"]), default=0)
        engine_free = last[s.engine].end if s.engine in last else 0
        # after its deps and its engine's previous command (so one engine's slots never overlap),
        # and no later than that
        assert s.start == max(deps_end, engine_free)
        last[s.engine] = s
    for engine in {s.engine for s in slots}:
        mine = [s for s in slots if s.engine == engine]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    per_engine = busy(slots)
    assert latency(slots) >= max(per_engine.values(), default=0)
    assert latency(slots) <= sum(c["cycles"] for c in commands)
    assert 0.0 <= overlap(slots) <= 1.0


def test_schedule_scales_linearly():
    """Scheduling is linear in the commands (a ratio, not a time: CI machines differ and share
    their cores; best of 5): 10x the commands take well under the 100x a quadratic scheduler
    would."""
    def best_time(n: int) -> float:
        commands = [cmd("dma" if i % 3 else "tiu", 1 + i % 7, *((i - 1,) if i else ())) for i in range(n)]
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            slots = schedule(commands)
            best = min(best, time.perf_counter() - t)
        assert len(slots) == n
        return best

    assert best_time(100_000) < 50 * best_time(10_000)


def test_chrome_trace_format():
    commands = [cmd("dma", 1000, name="load x", args={"bytes": 4096}), cmd("tiu", 500, 0),
                cmd("host", 10, 1), cmd("sdma", 20), cmd("cdma", 20)]
    slots = schedule(commands)
    trace = json.loads(json.dumps(chrome_trace(commands, slots, 1e9, name="resnet")))
    assert trace["displayTimeUnit"] == "ns" and trace["otherData"]["cycles"] == latency(slots)
    events = trace["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {"name": "resnet"} in [e["args"] for e in meta if e["name"] == "process_name"]
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    order = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert [threads[t] for t in sorted(threads, key=order.get)] == ["dma", "tiu", "host", "cdma", "sdma"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(commands)
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    # 1 GHz: a cycle is 1 ns, 0.001 us
    load, compute = xs[0], xs[1]
    assert load["name"] == "load x" and load["cat"] == "dma" and threads[load["tid"]] == "dma"
    assert load["args"] == {"index": 0, "cycles": 1000, "bytes": 4096}
    assert (load["ts"], load["dur"]) == (0, 1.0)
    assert compute["name"] == "tiu#1" and (compute["ts"], compute["dur"]) == (1.0, 0.5)
    # labels win over names; other frequencies scale the times
    labelled = chrome_trace(commands, slots, 3e8, labels=["a", "b", "c", "d", "e"])
    xs = [e for e in labelled["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["a", "b", "c", "d", "e"]
    assert xs[1]["ts"] == round(1000 / 3e8 * 1e6, 6) and xs[1]["dur"] == round(500 / 3e8 * 1e6, 6)
    assert [e for e in labelled["traceEvents"] if e["name"] == "process_name"][0]["args"]["name"] == "tpumodel"


def test_chrome_trace_rejects_mismatches():
    commands = [cmd("dma", 1)]
    with pytest.raises(InternalError):
        chrome_trace(commands, [], 1e9)
    with pytest.raises(InternalError):
        chrome_trace(commands, schedule(commands), 1e9, labels=["a", "b"])
    with pytest.raises(InternalError):
        chrome_trace(commands, schedule(commands), 0)


def test_write_trace_is_deterministic(tmp_path):
    commands = [Command("dma", 300, name="load"), Command("tiu", 700, (0,)), Command("dma", 300)]
    commands[2].args = {"bytes": np.int64(64), "shape": np.array([1, 8])}
    slots = schedule(commands)
    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.json"
    write_trace(a, commands, slots, 1.2e9, name="net")
    write_trace(b, list(commands), schedule(commands), 1.2e9, name="net")
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text(encoding="utf-8")
    trace = json.loads(text)
    assert " " not in text and text == json.dumps(trace, sort_keys=True, separators=(",", ":"))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["load", "tiu#1", "dma#2"]
    assert xs[2]["args"] == {"index": 2, "cycles": 300, "bytes": 64, "shape": [1, 8]}
    assert xs[1]["ts"] == 0.25 and xs[1]["dur"] == round(700 / 1.2e9 * 1e6, 6)
    assert list(tmp_path.glob("**/*.tmp")) == []
