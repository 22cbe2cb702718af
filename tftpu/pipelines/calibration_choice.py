"""Calibration judged at the outputs: one statistics pass, a table per method, the one whose
program comes nearest the float outputs kept.

A method that is best for each tensor on its own need not be best for the model: `mse` clips a
tensor's rare large values to round the common ones finer, and a detector's head carries its
objects in exactly those values, while other models lose more to a coarser grid
(docs/guides/quantize.md has the figures). So `try_tables` (`tftpu.compile`, by default
"mse,tail_mse", and `tftpu.pipelines.deploy` given a table with alternates, as tftpu-calibrate
writes) builds the whole program (equalization, search, refit, conv links) with the first
table and, where it misses the target on the test input and samples, the next table's program with
the same choices (float ops, links, correction: one refit and one judgement instead of a search),
searching again with it only where that comes near the best without reaching the target; the best
is kept. A model that meets the target with the first table costs nothing more. Where the first
table's search misses the target, the later tables' all-INT8 programs are judged before that
build goes on (a build's first steps each; one that comes near the target judged once more
with the dense convs' 16-bit inputs and GPTQ-rounded weights), and the first that reaches the
target is built first instead: all in INT8, it needs no float ops, trials or second build. (Judging each
table's plain all-INT8 program to pick the better table, where none meets, did not predict on
the detectors measured which table the final program does better with.)"""

from __future__ import annotations

import dataclasses
import math
import time

from tftpu import errors

__all__ = ["CALIBRATION_DEFAULT", "FULL_MARGIN", "GaveUp", "methods_of", "Reach", "target_of", "Tried", "try_tables"]

CALIBRATION_DEFAULT = "mse,tail_mse"
# a later table's program built with the first's choices is built in full (searched again) only
# where it comes within this many dB under the best so far (the quantization guide's "which
# method" has the detectors it was measured on)
FULL_MARGIN = 3.0


def methods_of(spec) -> tuple[str, ...]:
    """The methods of a `calibration_method` string ("mse", or several: "mse,minmax"), checked."""
    from tftpu.quant import CALIBRATION_METHODS

    if not isinstance(spec, str) or not spec.strip():
        raise errors.UsageError(f"calibration_method {spec!r}: expected one of {', '.join(CALIBRATION_METHODS)}, "
                                "or several joined by commas (each judged at the outputs, the best kept)")
    methods = tuple(dict.fromkeys(m.strip() for m in spec.split(",")))
    for m in methods:
        if m not in CALIBRATION_METHODS:
            raise errors.UsageError(f"calibration_method {m!r}: expected one of {', '.join(CALIBRATION_METHODS)}")
    return methods


def target_of(mixed_precision) -> float:
    """The SQNR (dB) a program must reach for `try_tables` to stop: the mixed-precision target's."""
    from tftpu.transforms.lowering.search import AUTO_TARGET, parse_target

    spec = mixed_precision if mixed_precision not in (None, "none", "auto") else AUTO_TARGET
    return parse_target(spec)[1]


class GaveUp(Exception):
    """A build stopped after its search missed the target, as another table's program all in
    INT8 reaches it (`try_tables`' `probe`); args: the SQNR (dB) the search reached."""


@dataclasses.dataclass(frozen=True)
class Reach:
    """What a table's all-INT8 program reaches, (pooled, test input alone) worst SQNR: as a build
    starts its search from it (`plain`: uncorrected, the model input's links) and, where asked and
    that comes near the target, with the dense convs' 16-bit inputs and GPTQ-rounded weights
    (`rounded`; `weights`: that rounding, which a build then takes: `deploy.rounded_args`)."""

    plain: tuple
    rounded: tuple | None = None
    weights: object = None

    def meets(self, target: float) -> bool:
        return min(self.plain) >= target or self.rounded is not None and min(self.rounded) >= target


@dataclasses.dataclass
class Tried:
    """The method kept, what its build returned, each built method's (pooled, test input) SQNR."""

    method: str
    built: tuple
    figures: dict
    target: float
    seconds: dict
    carried: dict = dataclasses.field(default_factory=dict)   # method -> figures with the first's choices
    all_int8: dict = dataclasses.field(default_factory=dict)  # method -> its all-INT8 program's figures
    rounded: dict = dataclasses.field(default_factory=dict)   # method -> ... with 16-bit conv inputs, GPTQ's weights
    gave_up: tuple | None = None        # (method, the SQNR its search reached, seconds) of a build given up

    def as_dict(self) -> dict:
        out = {"method": self.method, "target_db": self.target,
               "judged_db": {m: [round(v, 3) for v in f] for m, f in self.figures.items()},
               "with_first_choices_db": {m: [round(v, 3) for v in f] for m, f in self.carried.items()},
               "seconds": {m: round(v, 3) for m, v in self.seconds.items()}}
        if self.all_int8:
            out["all_int8_db"] = {m: [round(v, 3) for v in f] for m, f in self.all_int8.items()}
        if self.rounded:
            out["all_int8_rounded_db"] = {m: [round(v, 3) for v in f] for m, f in self.rounded.items()}
        if self.gave_up is not None:
            out["gave_up"] = {"method": self.gave_up[0], "search_db": round(self.gave_up[1], 3),
                              "seconds": round(self.gave_up[2], 3)}
        return out

    @property
    def others_seconds(self) -> float:
        """What the choice cost beside the kept program's build: the others' builds (a build
        given up, and the all-INT8 judgements, included)."""
        return sum(v for m, v in self.seconds.items() if m != self.method) + \
            (self.gave_up[2] if self.gave_up is not None else 0.0)

    @property
    def line(self) -> str:
        first = next(iter(self.figures))
        given_up = ""
        if self.gave_up is not None:
            m, searched, _ = self.gave_up
            given_up = (f"{m}'s search reached {searched:.1f} dB, all INT8 with "
                        + ", ".join(f"{k} {min(f):.1f} dB" + (f" ({min(self.rounded[k]):.1f} dB with 16-bit dense conv "
                                                              "inputs and GPTQ-rounded weights)"
                                                              if k in self.rounded else "")
                                    for k, f in self.all_int8.items())
                        + f": {m}'s build given up, {first}'s built first; ")

        def built(m, f):
            if m not in self.carried:
                return f"{m} {min(f):.1f} dB"
            if tuple(f) == tuple(self.carried[m]):
                return f"{m} {min(f):.1f} dB (with {first}'s float ops, links and correction)"
            return f"{m} {min(f):.1f} dB (searched again; with {first}'s choices {min(self.carried[m]):.1f} dB)"

        tried = "; ".join(built(m, f) for m, f in self.figures.items())
        return f"{given_up}programs built with {tried} (worst part, test input and samples); {self.method} kept"


def _reached(deployed) -> tuple[float, float]:
    """(pooled, test input alone) worst SQNR of a deployed program, as its search judged it last."""
    lowered = getattr(deployed.search, "lowered", None)
    if lowered is not None:
        return tuple(lowered)
    judged = getattr(deployed, "judged", None)           # (a program built without a search)
    if judged is not None:
        return tuple(judged)
    worst = min((r.sqnr for r in deployed.rows if not math.isnan(r.sqnr)), default=-math.inf)
    return worst, worst


def try_tables(tables: dict, build, target: float, say=lambda line: None, like=None, probe=None) -> Tried:
    """Build the program with each of `tables` (method -> table, in order) through `build(method,
    table) -> (..., DeployResult)`, stopping at the first whose worst output part reaches `target`
    dB pooled and on the test input alone; the best so far (the first on a tie) kept.

    `like(method, table, first, first_method)`: the program with a later table built with the
    choices the first build made (its float ops, links and correction; `deploy.choices_of`); where
    given, a later table is built so first, and in full only where that misses the target and
    comes within `FULL_MARGIN` dB under the best so far (a build in full searches again).

    `probe(method, table) -> Reach | None`: the all-INT8 program a build with that table starts its
    search from (`deploy.all_int8_reach`). Where given, the first build is asked to give up
    (`build(method, table, give_up=...)`, raising `GaveUp`) once its search misses the target and
    a later table's all-INT8 program reaches it; that table is then built first, with the others
    after it as above (a program all in INT8 that meets the target needs no float ops, trials or
    second build: PP-OCRv6's text detector on a photo `mse` misses). Where only its rounded
    program (`Reach.rounded`) reaches it, it is built first with that rounding
    (`build(method, table, rounded=Reach.weights)`)."""
    figures, seconds, best, kept = {}, {}, None, None
    carried: dict = {}                      # method -> figures of its build with the first's choices
    methods = list(tables)
    all_int8: dict = {}
    rounded: dict = {}                      # method -> its rounded all-INT8 program's figures
    given: dict = {}                        # method -> the rounding its all-INT8 program met the target with
    gave_up = None
    first = None                            # the first build

    def give_up() -> bool:
        """Whether a later table's all-INT8 program meets the target (then built first)."""
        for m in methods[1:]:
            reach = probe(m, tables[m])
            if reach is None:
                return False
            all_int8[m] = reach.plain
            if reach.rounded is not None:
                rounded[m] = reach.rounded
            if reach.meets(target):
                if min(reach.plain) < target:
                    given[m] = reach.weights
                methods.remove(m)
                methods.insert(0, m)
                return True
        return False

    opening = opened = None                 # the first build, asked to give up where it may, and its seconds
    if probe is not None and len(methods) > 1:
        t0 = time.perf_counter()
        try:
            opening = build(methods[0], tables[methods[0]], give_up=give_up)
        except GaveUp as stop:
            gave_up = (methods[1], float(stop.args[0]), time.perf_counter() - t0)
            say(f"    (calibration {gave_up[0]}: its search reaches {gave_up[1]:.1f} dB, below the "
                f"{target:g} dB target, where all INT8 with {methods[0]} reaches "
                + (f"{min(rounded[methods[0]]):.1f} dB with 16-bit dense conv inputs and GPTQ-rounded weights"
                   if methods[0] in given else f"{min(all_int8[methods[0]]):.1f} dB")
                + f": built with {methods[0]} first)")
            opening = None
        opened = time.perf_counter() - t0
    for i, method in enumerate(methods):
        t0 = time.perf_counter()
        if i == 0 and opening is not None:
            built, t0 = opening, t0 - opened
        elif i == 0 or like is None:
            built = build(method, tables[method], **({"rounded": given[method]} if method in given else {}))
        else:
            built = like(method, tables[method], first, methods[0])
            carried[method] = _reached(built[-1])
            near = min(figures[best]) - FULL_MARGIN < min(carried[method]) <= min(figures[best])
            if min(carried[method]) < target and near:
                say(f"    (calibration {method} with {methods[0]}'s float ops, links and correction: "
                    f"{min(carried[method]):.1f} dB, within {FULL_MARGIN:g} dB of {best}'s: built in full)")
                full = build(method, tables[method])
                if min(_reached(full[-1])) > min(carried[method]):
                    built = full
        if i == 0:
            first = built
        seconds[method] = time.perf_counter() - t0
        figures[method] = _reached(built[-1])
        if best is None or min(figures[method]) > min(figures[best]):
            best, kept = method, built
        if min(figures[method]) >= target:
            break
        if i + 1 < len(methods):
            say(f"    (calibration {method}: the program reaches {figures[method][0]:.1f} dB pooled, "
                f"{figures[method][1]:.1f} dB on the test input, below the {target:g} dB target: "
                f"built again with {methods[i + 1]})")
    return Tried(best, kept, figures, target, seconds, carried, all_int8, rounded, gave_up)
