"""`tftpu-deploy --report`: what was deployed and where accuracy is lost, as JSON (`.json`) or
as a self-contained HTML page (any other suffix; no network needed to open it): per tensor in
program order, cosine and SQNR against TOP as a plot, and each op's mode with the reason.
"""

from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path

from tftpu.quant.links import InputConvs, wide_weights
from tftpu.transforms.lowering.lower import producer_names
from tftpu.transforms.lowering.search import KEPT_FIGURES, lowered_text
from tftpu.utils.files import write_text

__all__ = ["report_data", "write_report", "html_page", "svg"]



def _tables_line(data: dict) -> str:
    """The interpolated tables' trial (`wide_links="auto"`), where one ran."""
    return f"<p>{html.escape(data['interpolated_tables'])}</p>" if data.get("interpolated_tables") else ""

def _num(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def _row(r) -> dict:
    return {"name": r.name, "shape": list(r.shape), "cosine": _num(r.cosine), "euclid": _num(r.euclid),
            "sqnr_db": _num(r.sqnr), "passed": bool(r.passed), "note": r.note}


def _ops(result) -> list[dict]:
    """Each TOP op: its TPU type, mode and why, and its estimated cycles (in the program, layer
    groups and all, when there is one; else the per-op estimate)."""
    if result.profile is not None:
        cycles = {o["name"]: (o["type"], o["cycles"]) for o in result.profile.ops}
    else:
        cycles = {o.name: (o.type, o.cycles) for o in (result.cycles.ops if result.cycles is not None else [])}
    out = []
    for d in result.lowering.decisions:
        # (a model output's f32 cast takes the TOP op's name: the op computing it is renamed)
        c = next((cycles[n] for n in producer_names(d.name) if n in cycles), None)
        out.append({"name": d.name, "type": c[0] if c else d.op, "top_type": d.op, "mode": d.mode,
                    "reason": d.reason, "cycles": c[1] if c else 0})
    return out


def report_data(result) -> dict:
    """The report as plain data (what the JSON form holds)."""
    model = result.model
    modes = {d.name: d for d in result.lowering.decisions}
    data = {
        "model": model.name, "chip": model.chip, "mode": model.mode, "asymmetric": model.asymmetric,
        "tolerance": list(result.tolerance), "reference": result.reference,
        "checked": result.checked, "passed": result.passed if result.checked else None,
        "flops": int(model.flops()),
        "modes": result.lowering.counts(),
        "flop_shares": {m: round(v, 6) for m, v in result.lowering.flop_shares().items()},
        "ops": _ops(result),
        "outputs": [_row(r) for r in result.outputs],
        "output_parts": [{"output": out, "parts": [_row(r) for r in rows]} for out, rows in result.parts],
        "tensors": [dict(_row(r), mode=modes[r.name].mode if r.name in modes else None)
                    for r in (result.tensors.rows if result.tensors else [])],
        "seconds": {k: round(v, 3) for k, v in result.seconds.items()},
        "files": {"tpu_mlir": str(result.mlir) if result.mlir else None,
                  "weights": str(result.weights) if result.weights else None},
    }
    if result.search is not None:
        data["mixed_precision"] = result.search.as_dict()
    links = result.wide_links               # a set of conv names reading 16 bits: listed
    reading = sorted(n for n in links if isinstance(n, str)) if isinstance(links, (set, frozenset)) else links
    data["wide_links"] = {"input_convs": reading} if isinstance(links, InputConvs) else reading
    if wide_weights(links):
        data["wide_weights"] = sorted(wide_weights(links))
    if result.weights_alone is not None:
        data["weights_alone_db"] = {"pooled": round(result.weights_alone[0], 3),
                                    "test_input": round(result.weights_alone[1], 3), "line": result.weights_line,
                                    "worst_convs": {n: round(db, 3) for n, db in result.weights_worst}}
    if result.beyond_range:
        data["beyond_range"] = {"line": result.range_line,
                                "tensors": [[n, round(v, 6), round(b, 6)] for n, v, b in result.beyond_range]}
    if result.tables:
        data["interpolated_tables"] = result.tables
    if result.conv_links:
        data["conv_links"] = result.conv_links
    if result.equalize:
        data["equalize"] = result.equalize
    if result.cross_layer:
        data["cross_layer"] = result.cross_layer
    if result.reader_ranges:
        data["reader_ranges"] = result.reader_ranges
    if result.calibration is not None:
        data["calibration"] = result.calibration.as_dict()
    if result.memory is not None:
        data["memory"] = result.memory.as_dict()
    if result.profile is not None:
        prof = result.profile
        data["latency_us"] = round(prof.latency_us, 3)
        data["cycles"] = prof.cycles
        data["utilisation"] = round(prof.utilisation, 6)
        data["timeline"] = {k: v for k, v in prof.as_dict().items() if k not in ("ops", "flops", "latency_us",
                                                                                  "utilisation", "cycles")}
    elif result.cycles is not None:
        data["latency_us"] = round(result.cycles.latency_us, 3)
        data["cycles"] = result.cycles.cycles
        data["utilisation"] = round(result.cycles.utilisation, 6)
    if result.cycles is not None:
        data["latency_us_without_groups"] = round(result.cycles.latency_us, 3)
    if result.program is not None and result.program.groups is not None:
        data["layer_groups"] = result.program.groups.as_dict()
        data["host_ops"] = [g.ops[0].name for g in result.program.groups.groups if g.on_host]
        if result.program.host_plan is not None:
            data["host"] = result.program.host_plan.as_dict()
        data["inputs"] = result.program.inputs
    if result.simulator is not None:
        data["simulator"] = result.simulator
    stem = result.s2d
    data["files"]["model"] = str(result.model_file) if result.model_file else None
    data["files"]["trace"] = str(result.trace) if result.trace else None
    data["s2d"] = {"applied": bool(stem and stem.get("applied")), "first_conv": stem["name"] if stem else None,
                   "first_conv_cycles": [stem["before"], stem["after"]] if stem and stem.get("before") else None,
                   "reason": stem.get("reason", "") if stem else ""}
    return data


def write_report(path, result) -> None:
    """Write the report to `path`: JSON for `.json`, otherwise HTML."""
    data = report_data(result)
    if Path(path).suffix.lower() == ".json":
        write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")
    else:
        write_text(path, html_page(data))


_COLORS = {"INT8": "#1f77b4", "F16": "#ff7f0e", "BF16": "#2ca02c", "F32": "#d62728", None: "#7f7f7f"}


def _plot(tensors: list[dict]) -> str:
    """Cosine and SQNR per tensor in program order, coloured by mode, as inline SVG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(tensors)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for mode in sorted({t["mode"] for t in tensors}, key=str):
        idx = [i for i, t in enumerate(tensors) if t["mode"] == mode]
        cos = [tensors[i]["cosine"] if tensors[i]["cosine"] is not None else float("nan") for i in idx]
        snr = [min(tensors[i]["sqnr_db"], 100.0) if tensors[i]["sqnr_db"] is not None else float("nan") for i in idx]
        label = mode or "input / cast"
        ax1.scatter(idx, cos, s=10, color=_COLORS.get(mode, "#7f7f7f"), label=label)
        ax2.scatter(idx, snr, s=10, color=_COLORS.get(mode, "#7f7f7f"), label=label)
    ax1.set_ylabel("cosine vs TOP")
    ax2.set_ylabel("SQNR (dB, capped at 100)")
    ax2.set_xlabel("tensor, in program order")
    ax1.legend(loc="lower left", fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    if xs:
        ax2.set_xlim(-1, len(xs))
    fig.tight_layout()
    return svg(fig)


def svg(fig) -> str:
    """A matplotlib figure as inline SVG (the same data gives the same bytes), and closed."""
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "tftpu"
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in cols)
    body = []
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r.get(key)
            text = f"{v:.6f}" if isinstance(v, float) and "sqnr" not in key else (
                f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v)))
            cls = ' class="fail"' if key == "passed" and v is False else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _memory_line(data: dict) -> str:
    m = data.get("memory")
    if not m:
        return ""
    return (f" DDR: weights {m['weight_bytes']:,} B, activations {m['peak']:,} B at peak "
            f"(lower bound {m['lower_bound']:,} B).")


def _latency_line(data: dict) -> str:
    if "latency_us" not in data:
        return ""
    line = (f" Estimated latency {data['latency_us']:,.1f} us, matrix unit utilisation "
            f"{100 * data['utilisation']:.1f}%.")
    s2d = data.get("s2d") or {}
    if s2d.get("first_conv_cycles"):
        before, after = s2d["first_conv_cycles"]
        state = "applied" if s2d.get("applied") else "not applied (--space_to_depth applies it)"
        line += (f" The first conv ({html.escape(s2d['first_conv'])}) takes {before:,} cycles; in space-to-depth "
                 f"form {after:,} ({before / max(after, 1):.2f}x fewer; {state}).")
    return line


def html_page(data: dict) -> str:
    """The report as one self-contained HTML page."""
    status = "not checked" if data["passed"] is None else ("passed" if data["passed"] else "FAILED")
    modes = ", ".join(f"{n} {m}" for m, n in sorted(data["modes"].items()))
    sim_cols = [("name", "tensor"), ("cosine", "cosine"), ("euclid", "euclidean"), ("sqnr_db", "SQNR dB"),
                ("passed", "passed"), ("note", "note")]
    parts = "".join(f"<h3>{html.escape(p['output'])}: each part</h3>" + _table(p["parts"], sim_cols)
                    for p in data["output_parts"])
    kept = [o for o in data["ops"] if o["mode"] != data["mode"]]
    search = ""
    if "mixed_precision" in data:
        mp = data["mixed_precision"]
        lowered = mp.get("lowered_sqnr_db") and lowered_text(mp["lowered_sqnr_db"], mp["target"][1])
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in (mp.get("rival"), mp.get("trimmed"), lowered) if n)
        search = (f"<h2>Mixed precision search</h2><p>{html.escape(mp['summary'])}</p>{notes}"
                  + _table(mp["kept"], [("name", "op"), ("mode", "mode"), KEPT_FIGURES.get(mp.get("ranking"), KEPT_FIGURES["isolated"])]))
    worst = sorted([t for t in data["tensors"] if t["cosine"] is not None], key=lambda t: t["cosine"])[:10]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tftpu deploy: {html.escape(data['model'])}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:left}} .fail{{color:#b00;font-weight:bold}}</style>
</head><body>
<h1>{html.escape(data['model'])} on {html.escape(data['chip'])} in {html.escape(data['mode'])}{' (asymmetric)' if data['asymmetric'] else ''}</h1>
<p>Check against {html.escape(data['reference'])}: <b>{status}</b> (tolerance cosine {data['tolerance'][0]}, euclidean {data['tolerance'][1]}).
Ops per mode: {html.escape(modes)}. {data['flops']:,} FLOPs.{_memory_line(data)}{_latency_line(data)}</p>
<h2>Outputs</h2>{_table(data['outputs'], sim_cols)}{parts}
<h2>Every tensor against TOP</h2>{_plot(data['tensors']) if data['tensors'] else '<p>No test input was given.</p>'}
<h3>Worst tensors</h3>{_table(worst, sim_cols + [('mode', 'mode')])}
{search}{_tables_line(data)}
<h2>Ops not in {html.escape(data['mode'])}, and why</h2>{_table(kept, [('name', 'op'), ('type', 'type'), ('mode', 'mode'), ('reason', 'reason')]) if kept else '<p>None.</p>'}
<h2>Time per stage</h2>{_table([{'stage': k, 'seconds': v} for k, v in data['seconds'].items()], [('stage', 'stage'), ('seconds', 'seconds')])}
</body></html>
"""
