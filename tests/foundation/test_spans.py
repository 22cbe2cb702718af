"""tftpu.utils.spans: where a long job's time goes, as Chrome trace events."""

import json
import threading

import pytest

from tftpu.errors import InternalError
from tftpu.utils import spans


def test_spans_record_nothing_without_a_recording():
    with spans.span("alone", n=1):
        pass
    with spans.recording() as rec:
        pass
    assert rec.events == [] and rec.totals() == {}
    assert [e["ph"] for e in rec.chrome()["traceEvents"]] == ["M"]        # the main thread's track name only


def test_spans_on_threads_become_nested_tracks(tmp_path):
    def work():
        with spans.span("refit", rounding="gptq", ops=3):
            pass

    with spans.recording() as rec:
        with spans.span("program", table="mse"):
            with spans.span("judge"):
                pass
            worker = threading.Thread(target=work, name="worker-1")
            worker.start()
            worker.join()
    assert {e[0] for e in rec.events} == {"program", "judge", "refit"}
    trace = rec.chrome()
    names = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[threading.main_thread().name] == 1 and names["worker-1"] == 2
    done = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in done] == ["program", "judge", "refit"]          # by start, outer first
    program, judge, refit = done
    assert program["tid"] == judge["tid"] == 1 and refit["tid"] == 2
    assert program["ts"] <= judge["ts"] and judge["ts"] + judge["dur"] <= program["ts"] + program["dur"] + 1e-3
    assert refit["args"] == {"rounding": "gptq", "ops": 3} and program["args"] == {"table": "mse"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in done)
    totals = rec.totals()
    assert totals["program"] >= totals["judge"] >= 0
    path = tmp_path / "trace.json"
    rec.write(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


def test_spans_keep_a_failed_block_and_refuse_a_second_recording():
    with spans.recording() as rec:
        with pytest.raises(ValueError):
            with spans.span("fails"):
                raise ValueError("bad")
        with pytest.raises(InternalError, match="already in progress"):
            with spans.recording():
                pass
    assert [e[0] for e in rec.events] == ["fails"]
    with spans.recording() as again:             # the first ended: a new one may start
        with spans.span("next"):
            pass
    assert [e[0] for e in again.events] == ["next"]
