"""ONNX LSTM and GRU -> TOP: each unrolled over its (static) sequence into the ops TOP has.

The input projection of every step is one MatMul over the whole sequence; each step then adds
the recurrent MatMul, splits the gates and applies Sigmoid / Tanh, Mul and Add, exactly as ONNX
defines them (gate order i, o, f, c for LSTM; z, r, h for GRU). So a recognizer's BiLSTM
(CRNN-style OCR) imports, runs and quantizes with the ops' own lowerings. Supported: forward,
reverse and bidirectional; biases, initial states (constant or computed), LSTM peepholes, GRU's
`linear_before_reset` both ways; `layout` 0. Refused (one line naming the node): custom
activations, `clip`, `input_forget`, `layout` 1, per-batch `sequence_lens` shorter than the
sequence.
"""

from __future__ import annotations

import numpy as np

from tftpu.frontend.onnx_registry import Unsupported, converter

_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


class _Cell:
    """What one direction of a recurrent node needs while it is unrolled."""

    def __init__(self, imp, node, a, kind: str):
        self.imp, self.node, self.kind = imp, node, kind
        direction = a.get("direction", "forward")
        if isinstance(direction, bytes):
            direction = direction.decode()
        if direction not in ("forward", "reverse", "bidirectional"):
            raise Unsupported(f"direction {direction!r}")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        acts = [x.decode() if isinstance(x, bytes) else x for x in a.get("activations", [])]
        if acts and acts != _DEFAULT_ACTS[kind] * len(self.directions):
            raise Unsupported(f"activations {acts} (only the default {', '.join(_DEFAULT_ACTS[kind])})")
        if a.get("clip") is not None:
            raise Unsupported("clip")
        if a.get("input_forget", 0):
            raise Unsupported("input_forget=1")
        if a.get("layout", 0):
            raise Unsupported("layout=1 (batch first)")
        self.seq, self.batch, self.input_size = imp.shape(node.input[0])
        self.hidden = int(a["hidden_size"])
        self.name = next(o for o in node.output if o)     # a node nothing reads is never imported
        lens = imp.const(node.input[4]) if len(node.input) > 4 and node.input[4] else None
        if len(node.input) > 4 and node.input[4] and lens is None:
            raise Unsupported("sequence_lens must be a constant")
        if lens is not None and np.any(np.asarray(lens) != self.seq):
            raise Unsupported(f"sequence_lens {np.asarray(lens).tolist()} shorter than the sequence ({self.seq})")

    def steps(self, direction: str) -> range:
        """The order a direction runs its steps in."""
        return range(self.seq) if direction == "forward" else range(self.seq - 1, -1, -1)

    def op(self, op_name: str, operands: list, attrs: dict, suffix: str):
        return self.imp.b.op(op_name, operands, attrs, f"{self.name}_{suffix}")

    def weight(self, suffix: str, arr: np.ndarray):
        return self.imp.weight(f"{self.name}_{suffix}", np.ascontiguousarray(arr, np.float32))

    def matmul(self, x, w: np.ndarray, bias, suffix: str):
        """x @ w.T (+ bias): w is [out, in], as ONNX stores W and R."""
        return self.op("MatMul", [x, self.weight(f"{suffix}_w", w),
                                  self.imp.b.none() if bias is None else self.weight(f"{suffix}_b", bias)],
                       {"right_transpose": True, "do_relu": False, "relu_limit": -1.0}, suffix)

    def state(self, index: int, d: int, what: str):
        """Direction `d`'s initial state from input `index` as [B, H], or None when it is absent
        or constant zero (the first step then skips what it would add)."""
        node = self.node
        if len(node.input) <= index or not node.input[index]:
            return None
        const = self.imp.const(node.input[index])
        if const is not None:
            if not np.any(const[d]):
                return None
            return self.weight(f"d{d}_{what}0", const[d].reshape(self.batch, self.hidden))
        x = self.imp.value(node.input[index])
        x = self.op("Slice", [x], {"starts": [d], "ends": [d + 1], "steps": [1], "axes": [0]}, f"d{d}_{what}0_slice")
        return self.op("Reshape", [x], {"shape": [self.batch, self.hidden]}, f"d{d}_{what}0")

    def projected_steps(self, w: np.ndarray, bias, d: int, gates: int) -> list:
        """x_t @ W.T (+ bias) for every step t: one MatMul over the sequence, split per step."""
        imp, t_len = self.imp, self.seq
        x = self.op("Reshape", [imp.value(self.node.input[0])], {"shape": [t_len * self.batch, self.input_size]},
                    f"d{d}_x")
        xw = self.matmul(x, w, bias, f"d{d}_xw")
        if t_len == 1:
            return [xw]
        xw = self.op("Reshape", [xw], {"shape": [t_len, self.batch * gates * self.hidden]}, f"d{d}_xw_steps")
        parts = self.op("Split", [xw], {"axis": 0, "split_size": [1] * t_len},
                        [f"{self.name}_d{d}_xw_t{t}" for t in range(t_len)])
        parts = parts if isinstance(parts, list) else [parts]
        return [self.op("Reshape", [p], {"shape": [self.batch, gates * self.hidden]}, f"d{d}_x_t{t}")
                for t, p in enumerate(parts)]

    def gates(self, v, count: int, tag: str) -> list:
        got = self.op("Split", [v], {"axis": 1, "split_size": [self.hidden] * count},
                      [f"{self.name}_{tag}_g{k}" for k in range(count)])
        return got if isinstance(got, list) else [got]

    def finish(self, steps_h: list, last: dict):
        """Bind the node's outputs: Y [T, D, B, H] from every step, and the last states
        ([D, B, H]) named in `last` (output index -> one value per direction)."""
        imp, node, b, h = self.imp, self.node, self.batch, self.hidden
        if len(node.output) > 0 and node.output[0]:
            per_dir = []
            for d, hs in enumerate(steps_h):
                rows = [self.op("Reshape", [v], {"shape": [1, 1, b, h]}, f"d{d}_y_t{t}") for t, v in enumerate(hs)]
                per_dir.append(rows[0] if len(rows) == 1 else
                               self.op("Concat", rows, {"axis": 0, "do_relu": False}, f"d{d}_y"))
            _bind(imp, node, 0, per_dir, 1, [self.seq, len(steps_h), b, h])
        for index, values in last.items():
            if len(node.output) > index and node.output[index]:
                rows = [self.op("Reshape", [v], {"shape": [1, b, h]}, f"d{d}_last{index}")
                        for d, v in enumerate(values)]
                _bind(imp, node, index, rows, 0, [len(values), b, h])


def _bind(imp, node, index: int, parts: list, axis: int, shape: list) -> None:
    """Name the value joining `parts` along `axis` after the node's output `index`."""
    if len(parts) == 1:
        imp.emit(node, "Reshape", parts, {"shape": shape}, out=index)
    else:
        imp.emit(node, "Concat", parts, {"axis": axis, "do_relu": False}, out=index)


def _weights(imp, node, gates: int, hidden: int, dirs: int):
    w = imp.need_const(node.input[1], "W").astype(np.float32)
    r = imp.need_const(node.input[2], "R").astype(np.float32)
    bias = imp.const(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if len(node.input) > 3 and node.input[3] and bias is None:
        raise Unsupported("B must be a constant")
    if w.shape[:2] != (dirs, gates * hidden) or r.shape != (dirs, gates * hidden, hidden):
        raise Unsupported(f"W {list(w.shape)} / R {list(r.shape)} do not match hidden_size {hidden}")
    bias = np.zeros((dirs, 2 * gates * hidden), np.float32) if bias is None else bias.astype(np.float32)
    return w, r, bias


@converter("LSTM")
def _lstm(imp, node, a):
    cell = _Cell(imp, node, a, "LSTM")
    h = cell.hidden
    w, r, bias = _weights(imp, node, 4, h, len(cell.directions))
    peep = imp.const(node.input[7]) if len(node.input) > 7 and node.input[7] else None
    if len(node.input) > 7 and node.input[7] and peep is None:
        raise Unsupported("P (peepholes) must be a constant")
    steps_h, last_h, last_c = [], [], []
    for d, direction in enumerate(cell.directions):
        xs = cell.projected_steps(w[d], bias[d, :4 * h] + bias[d, 4 * h:], d, 4)
        hp, cp = cell.state(5, d, "h"), cell.state(6, d, "c")
        p = None if peep is None or not np.any(peep[d]) else peep[d].reshape(3, h)
        hs = {}
        for t in cell.steps(direction):
            tag = f"d{d}_t{t}"
            g = xs[t] if hp is None else cell.op("Add", [xs[t], cell.matmul(hp, r[d], None, f"{tag}_hr")], {},
                                                 f"{tag}_gates")
            gi, go, gf, gc = cell.gates(g, 4, tag)
            if p is not None and cp is not None:       # peepholes: i and f see C(t-1), o sees C(t)
                gi = cell.op("Add", [gi, cell.op("Mul", [cp, cell.weight(f"d{d}_pi", p[0])], {}, f"{tag}_pi")], {},
                             f"{tag}_gi_p")
                gf = cell.op("Add", [gf, cell.op("Mul", [cp, cell.weight(f"d{d}_pf", p[2])], {}, f"{tag}_pf")], {},
                             f"{tag}_gf_p")
            i = cell.op("Sigmoid", [gi], {}, f"{tag}_i")
            c_new = cell.op("Mul", [i, cell.op("Tanh", [gc], {}, f"{tag}_c_in")], {}, f"{tag}_ic")
            if cp is not None:
                f = cell.op("Sigmoid", [gf], {}, f"{tag}_f")
                c_new = cell.op("Add", [cell.op("Mul", [f, cp], {}, f"{tag}_fc"), c_new], {}, f"{tag}_c")
            if p is not None:
                go = cell.op("Add", [go, cell.op("Mul", [c_new, cell.weight(f"d{d}_po", p[1])], {}, f"{tag}_po")], {},
                             f"{tag}_go_p")
            o = cell.op("Sigmoid", [go], {}, f"{tag}_o")
            hp = cell.op("Mul", [o, cell.op("Tanh", [c_new], {}, f"{tag}_c_out")], {}, f"{tag}_h")
            cp = c_new
            hs[t] = hp
        steps_h.append([hs[t] for t in range(cell.seq)])
        last_h.append(hp)
        last_c.append(cp)
    cell.finish(steps_h, {1: last_h, 2: last_c})


@converter("GRU")
def _gru(imp, node, a):
    cell = _Cell(imp, node, a, "GRU")
    h = cell.hidden
    w, r, bias = _weights(imp, node, 3, h, len(cell.directions))
    before_reset = bool(a.get("linear_before_reset", 0))
    steps_h, last_h = [], []
    for d, direction in enumerate(cell.directions):
        wb, rb = bias[d, :3 * h], bias[d, 3 * h:]
        # z and r take both biases with the input projection; h's recurrent bias stays with R
        xs = cell.projected_steps(w[d], wb + np.concatenate([rb[:2 * h], np.zeros(h, np.float32)]), d, 3)
        hp = cell.state(5, d, "h")
        hs = {}
        for t in cell.steps(direction):
            tag = f"d{d}_t{t}"
            xz, xr, xh = cell.gates(xs[t], 3, f"{tag}_x")
            if hp is None:                          # a zero state: what R adds is its bias alone
                z = cell.op("Sigmoid", [xz], {}, f"{tag}_z")
                gate_h, rbh = xh, rb[2 * h:]
                if np.any(rbh):                     # + Rbh, or + r * Rbh where the reset comes after R
                    add = cell.weight(f"d{d}_rbh", rbh)
                    if before_reset:
                        add = cell.op("Mul", [cell.op("Sigmoid", [xr], {}, f"{tag}_r"), add], {}, f"{tag}_r_rbh")
                    gate_h = cell.op("Add", [xh, add], {}, f"{tag}_hs")
                hh = cell.op("Tanh", [gate_h], {}, f"{tag}_hh")
                one_minus_z = cell.op("Sub", [cell.weight(f"d{d}_one", np.ones(1, np.float32)), z], {}, f"{tag}_1z")
                hp = hs[t] = cell.op("Mul", [one_minus_z, hh], {}, f"{tag}_h")
                continue
            hz, hr = cell.gates(cell.matmul(hp, r[d, :2 * h], None, f"{tag}_hr_zr"), 2, f"{tag}_hzr")
            z = cell.op("Sigmoid", [cell.op("Add", [xz, hz], {}, f"{tag}_zs")], {}, f"{tag}_z")
            rr = cell.op("Sigmoid", [cell.op("Add", [xr, hr], {}, f"{tag}_rs")], {}, f"{tag}_r")
            if before_reset:                        # r * (h @ Rh.T + Rbh)
                rh = cell.matmul(hp, r[d, 2 * h:], rb[2 * h:], f"{tag}_hr_h")
                rh = cell.op("Mul", [rr, rh], {}, f"{tag}_r_rh")
            else:                                   # (r * h) @ Rh.T + Rbh
                rh = cell.matmul(cell.op("Mul", [rr, hp], {}, f"{tag}_rh_in"), r[d, 2 * h:], rb[2 * h:],
                                 f"{tag}_hr_h")
            hh = cell.op("Tanh", [cell.op("Add", [xh, rh], {}, f"{tag}_hs")], {}, f"{tag}_hh")
            # h' = (1 - z) * hh + z * h = hh + z * (h - hh)
            hp = cell.op("Add", [hh, cell.op("Mul", [z, cell.op("Sub", [hp, hh], {}, f"{tag}_dh")], {},
                                             f"{tag}_zdh")], {}, f"{tag}_h")
            hs[t] = hp
        steps_h.append([hs[t] for t in range(cell.seq)])
        last_h.append(hp)
    cell.finish(steps_h, {1: last_h})
