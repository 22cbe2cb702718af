"""The `tftpu-deploy` job as a library call: lower a TOP model for a chip and mode, check the
TPU model against TOP tensor by tensor, write the `.tpu.mlir` (+ weights) and a report.

>>> result = deploy("resnet.top.mlir", quantize="INT8", chip="npu1",
...                 calibration_table="resnet_cali_table", test_input={"input": x})  # doctest: +SKIP
>>> result.passed, result.outputs[0].cosine                                         # doctest: +SKIP
(True, 0.9993)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from tftpu import chip as chips
from tftpu import errors
from tftpu.interp.similarity import Comparison, max_relative_difference, parse_tolerance
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import top
from tftpu.ir.base import value_name
from tftpu.quant import params as P
from tftpu.quant.links import InputConvs
from tftpu.quant.refit import INPUT_BUDGET as REFIT_INPUTS
from tftpu.quant.refit import MAX_SAMPLES as REFIT_SAMPLES
from tftpu.quant.refit import ROUNDINGS as REFIT_ROUNDINGS
from tftpu.quant.table import CalibrationTable
from tftpu.utils.choices import AUTO, check_choices
from tftpu.transforms.lowering.decode_tail import decode_tail
from tftpu.transforms.lowering.lower import producer_names
from tftpu.utils.spans import span
from tftpu.utils.threads import pool_size
from tftpu.pipelines.equalization import check_cross_layer, check_equalize, cross_layer_step, equalize_step
from tftpu.pipelines.conv_links import CONV_LINKS_LATENCY, input_links, program_profile, rank_conv_links
from tftpu.pipelines.judge import Judge as _Judge
from tftpu.pipelines.verify import SimulatorRow, check_simulator, verify
from tftpu.transforms.lowering.search import (AUTO_TARGET, FLOAT_BUDGET, LATENCY_BUDGET, RANK_SAMPLES, References,
                                              output_parts, parse_target, part_slices)   # (the last two re-exported)

__all__ = ["deploy", "DeployResult", "DEFAULT_TOLERANCE", "verify", "output_parts"]

# TPU-MLIR's default (cosine, euclidean) tolerances of a TPU model against TOP, per mode
DEFAULT_TOLERANCE = {"F32": (0.99, 0.99), "F16": (0.95, 0.85), "BF16": (0.95, 0.80), "INT8": (0.8, 0.5)}
_LOG = logging.getLogger("tftpu.deploy")
# after the refit, the last quarter of the search's float ops (in its ranking) is tried back in
# INT8 (one more build). Measured on the detectors (benchmarks/detectors.py, see quantize.md):
# taken on five of nine, and each of those gained; half the set, or another quarter, did worse
TRIM_SHARE = 0.25
TRIM_MIN_OPS = 4
# where the weights alone do this many dB better than the program, its noise is the activations'
WEIGHTS_MARGIN_DB = 3.0
# corrections computed ahead at once, beside the build in hand (`_Ahead`): each holds its samples'
# tensors (a 640x640 detector's compile peaks near 5 GB with three at once)
AHEAD_WORKERS = 2
WORST_CONVS = 3           # the convs whose weights cost most, named where the weights alone miss
# a table's all-INT8 program (uncorrected, the model input's links) that misses the target by at
# most this many dB is judged once more with the dense convs' 16-bit inputs and GPTQ-rounded
# weights (`all_int8_reach(..., rounded=True)`). Measured (2026-12-08, held-out photo, worst part
# on it): PP-OCRv6 on text.png 19.2 dB, then 22.3 (meets); layout, YOLOX, both palm detectors,
# PP-OCRv4, face_back and pose start 5-18 dB under the target, where that rounding does not reach it
ROUNDED_PROBE_MARGIN = 3.0
# where the program misses: the test input's tensors this many times beyond their calibrated grid
# are named (twice: beyond the 16-bit links' headroom too, so clipped whatever their width)
BEYOND_RANGE = 2.0


@dataclasses.dataclass
class DeployResult:
    """What `deploy` made, what its checks found, and how long each stage took."""

    model: object                               # tftpu.ir.module.TpuModel
    lowering: object                            # LoweringReport
    tolerance: tuple[float, float]
    tensors: Comparison | None = None           # every tensor TPU shares with TOP
    outputs: list = dataclasses.field(default_factory=list)      # each model output vs the reference
    parts: list = dataclasses.field(default_factory=list)        # (output, part rows) for concatenated outputs
    reference: str = "TOP"
    mlir: Path | None = None
    weights: Path | None = None
    seconds: dict = dataclasses.field(default_factory=dict)
    search: object | None = None                # MixedPrecisionResult, when one ran
    memory: object | None = None                # tftpu.backend.MemoryPlan: DDR addresses, peak, lower bound
    cycles: object | None = None                # tftpu.backend.CycleReport: per-op cycles, latency
    s2d: dict | None = None                     # the stem's cycles as it is and in space-to-depth form
    program: object | None = None               # tftpu.backend.Program: layer groups, DDR plan, commands
    profile: object | None = None               # tftpu.backend.Profile: the program's estimated timeline
    simulator: dict | None = None               # the simulator's outputs against TPU inference
    model_file: Path | None = None
    trace: Path | None = None
    bias_correction: object | None = None       # tftpu.quant.bias_correction.BiasCorrection, when one ran
    weight_rounding: object | None = None       # tftpu.quant.weight_rounding.WeightRounding, when one ran
    tables: str | None = None                   # wide_links="auto": the interpolated tables' trial, and its verdict
    conv_links: str | None = None               # wide_links="auto": the dense convs reading 16 bits, and their price
    int8_latency_us: float | None = None        # where priced: the all-INT8 program's with 8-bit conv inputs
    wide_links: bool | str = True               # the links the program was lowered with (WIDE_LINKS)
    equalize: str | None = None                 # depthwise input equalization: what it did, and its verdict
    cross_layer: str | None = None              # cross-layer equalization: what it did, and its float check
    calibration: object | None = None           # a table with alternates: each one's program (calibration_choice.Tried)
    input_grid: str | None = None               # the stem conv reading the pixel levels exactly: what was done, or why not
    reader_ranges: str | None = None            # ranges clipped to what their saturating readers tell apart
    equalized: bool = False                     # the depthwise inputs equalized (`equalize` kept)
    judged: tuple | None = None                 # (pooled, test input alone) worst SQNR as the judge saw the program
    weights_alone_of: object | None = None      # where that misses the target: () -> `weights_alone`
    weights_each_of: object | None = None       # ... () -> {conv: worst SQNR with its weights alone rounded}
    beyond_of: object | None = None             # ... () -> `beyond_range`
    target_db: float | None = None              # the SQNR target the program was judged against
    pending_checks: object | None = None        # deploy(..., checks=False): (result) -> None, run by `run_checks`

    def run_checks(self) -> "DeployResult":
        """The test input's checks (verify, the simulator) that `deploy(..., checks=False)` left
        for later, run once; this result."""
        pending, self.pending_checks = self.pending_checks, None
        if pending is not None:
            pending(self)
        return self

    @functools.cached_property
    def weights_alone(self) -> tuple | None:
        """Where the INT8 program misses the target: (pooled, test input alone) worst SQNR of the
        TOP model with only its INT8 ops' weights rounded to nearest, run in float; measured once."""
        return None if self.weights_alone_of is None else self.weights_alone_of()

    @functools.cached_property
    def weights_worst(self) -> list[tuple[str, float]]:
        """Where the weights alone miss the target: the convs whose weights cost most, each alone
        rounded (the rest in float) on the test input, (name, worst output SQNR), worst first."""
        if self.weights_alone is None or self.target_db is None or min(self.weights_alone) >= self.target_db:
            return []
        effects = self.weights_each_of()
        return sorted(effects.items(), key=lambda t: (t[1], t[0]))[:WORST_CONVS]

    @functools.cached_property
    def beyond_range(self) -> list[tuple[str, float, float]]:
        """Where the INT8 program misses the target: the tensors whose values on the test input go
        `BEYOND_RANGE` times or more past their calibrated grid (name, value, the grid's end), the
        furthest first: an input unlike the calibration data, which no grid from that data holds."""
        return [] if self.beyond_of is None else self.beyond_of()

    @property
    def range_line(self) -> str | None:
        """`beyond_range` in one line, or None where no tensor goes that far."""
        rows = self.beyond_range
        if not rows:
            return None
        named = ", ".join(f"{n} {v:.4g} against {b:.4g}" for n, v, b in rows[:WORST_CONVS])
        more = f" and {len(rows) - WORST_CONVS} more" if len(rows) > WORST_CONVS else ""
        return (f"the test input goes {BEYOND_RANGE:g}x or more beyond the calibrated range of {len(rows)} "
                f"tensor(s), up to {rows[0][1] / rows[0][2]:.1f}x: {named}{more}; the grids clip it there, so "
                "calibration data like the test input would help more than any choice made here")

    @property
    def weights_line(self) -> str | None:
        """Where the INT8 program misses the target: its figures against those of its weights'
        rounding alone (the TOP model with its INT8 ops' weights rounded to nearest, run in float)."""
        if self.weights_alone is None or self.judged is None:
            return None
        (wp, wt), (p, t) = self.weights_alone, self.judged
        line = (f"the weights' rounding to nearest alone (activations in float): worst part {wp:.1f} dB on the "
                f"test input and samples, {wt:.1f} dB on the test input, against {p:.1f} / {t:.1f} dB for the program"
                + (" (with its corrections)" if self.bias_correction is not None and self.bias_correction.kept else ""))
        if self.target_db is not None and min(wp, wt) < self.target_db:
            line += (f": the weights alone miss the {self.target_db:g} dB target, which no calibration of the "
                     "activations then reaches (more of the model in float: mixed_precision_budget; or 16-bit "
                     "weights for the convs whose rounding costs most: tftpu-deploy --wide_weights, in place of "
                     "the priced 16-bit conv inputs)")
            if self.weights_worst:
                line += "; each conv's weights alone, on the test input: " + ", ".join(
                    f"{name} {db:.1f} dB" for name, db in self.weights_worst)
        elif min(wp, wt) - min(p, t) >= WEIGHTS_MARGIN_DB:
            line += ": the activations' rounding costs the most"
        return line

    @property
    def checked(self) -> bool:
        return bool(self.outputs)

    @property
    def rows(self) -> list:
        """Each output's row and each part's of a concatenated output."""
        return list(self.outputs) + [r for _, part in self.parts for r in part]

    @property
    def failed(self) -> list:
        """Output rows (and parts of concatenated outputs) under tolerance."""
        failed = [r for r in self.rows if not r.passed]
        if self.simulator is not None and not self.simulator["passed"]:
            failed.append(SimulatorRow(self.simulator))
        return failed

    @property
    def passed(self) -> bool:
        return self.checked and not self.failed

    def worst_tensors(self, n: int = 5) -> list:
        if self.tensors is None:
            return []
        finite = [r for r in self.tensors.rows if not math.isnan(r.cosine) and "rounding noise" not in r.note]
        return sorted(finite, key=lambda r: (r.cosine, r.sqnr))[:n]


def deploy(mlir, *, quantize: str, chip, calibration_table=None, quantize_table=None,
           asymmetric: bool | str | None = None,
           test_input=None, test_reference=None, tolerance=None, tpu_mlir=None, report=None,
           mixed_precision: str | None = "auto", samples: list[dict] | None = None, fit_samples: list[dict] | None = None,
           mixed_precision_ranking: str = "auto", mixed_precision_budget: float | None = FLOAT_BUDGET,
           mixed_precision_latency: float | None = LATENCY_BUDGET,
           space_to_depth: bool = False, model=None,
           trace=None, bias_correction: bool = False, weight_rounding: bool = False,
           wide_links: bool | str = "auto", float_tail: bool = True, weight_refit: bool = False,
           refit_rounding: str = "auto", conv_links: bool = True,
           equalize: bool | str = False, input_grid: bool = False, cross_layer: bool = False,
           reader_ranges: bool = True, checks: bool = True, _probe: bool | str = False, _give_up=None,
           _rounded=None) -> DeployResult:
    """Lower the TOP model `mlir` (a path or TopModel) for `chip` in `quantize` mode.

    `asymmetric` (INT8): True gives every activation a zero point, False none, "auto" those whose
    range is one-sided; None (the default) "auto" where the calibration table holds asymmetric
    ranges (`tftpu.quant.calibrate(..., asymmetric=True)`, tftpu-calibrate's default), else False.
    `test_input` (a dict of arrays or an .npz path) checks the TPU model against TOP, and
    `test_reference` (outputs) against a reference of your own. `mixed_precision`: in INT8
    with a test input, "auto" (the default) keeps pure INT8 where its outputs (and each part of
    a concatenated output) reach cosine 0.99 and SQNR 20 dB, otherwise the fewest ops in float
    that reach it; "cos,sqnr_db" sets another target; "none" keeps pure INT8. Inputs are all
    checked before anything is written. `space_to_depth` rewrites the first strided conv on the
    image to its S2D form first (a copy of the model; applied where the chip's matrix unit gains,
    see `tftpu.transforms.space_to_depth`; the host then makes the S2D input). The backend always
    runs (layer groups, DDR plan, codegen, the estimated timeline); `model` writes the
    `.tpumodel`, `trace` its timeline (Chrome trace JSON), and with a test input the simulator
    runs the program and is checked against TPU inference. `bias_correction` (INT8): the model
    lowered is a copy whose conv / matmul / deconv biases absorb the mean INT8 error measured on
    `samples` (else the test input; `tftpu.quant.bias_correction`), the ops the search keeps in
    float excepted, kept only if the worst output SQNR does not drop for it, judged as the search
    judges (the worse of the test input and `samples` pooled and the test input alone), nor on
    the test input alone unless it stays at the mixed-precision target (20 dB by default); every
    check still compares against the model given. `weight_rounding` (INT8): the INT8 ops'
    weights are rounded by per-layer reconstruction on `samples` (`tftpu.quant.weight_rounding`,
    GPTQ's error feedback) instead of to nearest, before the search (which then judges with
    them) and the bias correction; kept on the same condition. The search's float ops are then
    judged once more on the weights lowered: where all INT8 does as well, all runs in INT8.
    `mixed_precision_budget`: the most of the model's FLOPs the search may keep in float (a share,
    0..1; 5% by default, None: no limit); where the target needs more, it keeps what fits and
    says so. `mixed_precision_latency`: the most the float ops may slow the program, as a multiple
    of its estimated latency all in INT8 (the program's profile, as the report gives it; 1.15 by
    default, None: no limit), the same way. `mixed_precision_ranking`: the search's
    (`search_mixed_precision`); under "auto", where it ranked by "gain", the "isolated" ranking's
    float set is built as well and the one judged better on the weights lowered is kept
    (`search.rival` says which); where a refit or bias correction changes the weights after the
    search, the last quarter of its float ops is tried back in INT8 and left there where the
    judge holds (`search.trimmed`).
    `wide_links` (INT8, "auto" by default): a tensor that INT8 Add / Sub / PReLU ops or depthwise
    convs (in two passes) read is written on a 16-bit grid by the conv or Add that makes it, other
    readers taking it through a cast to 8 bits (`tftpu.quant.links`); "tables": a conv that only
    smooth activation tables
    read (SiLU, HardSwish, GELU, ...) as well, each table interpolating 513 knots from 16 bits;
    "convs": with the tables, every conv reads its data on 16 bits (W8A16, two INT8 passes); a set:
    with the tables, the convs it names read 16 bits, and those it names as
    `tftpu.quant.links.WideWeights(name)` multiply 16-bit weights (W16A8: two INT8 passes over
    the weights' high and low byte; the refit and bias correction simulate them so);
    "auto": the convs reading a model input read it on 16 bits where that keeps the all-INT8
    latency within `INPUT_LINKS_LATENCY`, or lifts a missed target by `INPUT_LINKS_GAIN` dB within
    the latency budget (`tftpu.pipelines.conv_links.input_links`; their price counts against the
    float ops'); and
    where all INT8 misses the target (`mixed_precision`'s, else 0.99 / 20 dB) on the test
    input and samples, the dense convs reading 16 bits too, the most noise spared at the outputs
    per cycle first, as many as keep the all-INT8 program's estimated latency within
    `CONV_LINKS_LATENCY` (or `mixed_precision_latency`, if lower) of the one with 8-bit conv inputs
    (`result.conv_links` says; `conv_links=False`: none), the float ops then held to what is left
    of `mixed_precision_latency` (their ratio and `result.int8_latency_us` are against the
    program with 8-bit conv inputs); where the search then misses the target, it runs once more
    with 8-bit conv inputs and the whole latency budget, and the one that reaches more is kept
    (`result.conv_links` says); where all INT8 is kept in the end (`mixed_precision="none"`, or
    the search's float ops undone) and misses the target, it is built once more with the convs
    priced at the whole `mixed_precision_latency`, with the correction it took, the better kept
    (`result.conv_links` ends with both figures and the choice); where float ops are kept and
    miss the target, that all-INT8 program is weighed against them as the float check weighs all
    INT8 (taken, the float ops undone, where it does better); where none fits,
    links (True) for the search and its builds, then, given a test input, the program
    chosen is built once more with the tables and the better kept, judged as the search judges
    (`result.tables` says; measured: the tables lift pure INT8, but the search's float ops, chosen
    without them, can lose their gain). `float_tail` (INT8, on by default): a detector's decode
    tail (`tftpu.transforms.lowering.decode_tail`) runs in float by design. `weight_refit`
    (INT8; in place of `weight_rounding`, and with `bias_correction` for the other ops): the
    bias-correction copy's 2-D convs get weights and biases refit to the simulated INT8 inputs they
    get with the float ops chosen (`tftpu.quant.refit`: on up to 16 images within its input budget,
    plain bias correction on up to 8), kept on the same condition. `fit_samples`: the inputs the
    refit and bias correction fit to, where not `samples` (`tftpu.compile` judges on 8 calibration
    images and fits on up to 16).
    `refit_rounding`: how the refit weights reach their INT8 grid: "nearest", "gptq" (each
    conv's rounding errors fed back through its INT8 inputs' covariance, the bias taking back
    their mean: `tftpu.quant.refit.Fit.rounded`), or "auto" (the default: with a test input, the
    first program built both ways, the better kept as the corrections are judged; measured: the
    full palm detector's pure INT8 14.6 -> 18.5 dB with GPTQ, PP-OCRv4's text detector better
    rounded to nearest). `equalize`
    (INT8, with `samples`): each depthwise conv's input (kernels over 7x7: smaller ones read it
    on a 16-bit link) scaled per channel nearer its widest
    channel on `samples`, the conv's weights taking the factors back
    (`tftpu.pipelines.equalization`); "auto" keeps it where the all-INT8 programs judge it 1 dB
    better; the model lowered and checked is then the equalized one (the same in float).
    `cross_layer` (INT8, with `samples`): each conv output read only by dense convs, the conv
    ending in nothing or a plain ReLU, scaled per channel nearer its widest channel, the readers'
    weights taking the factors back (`tftpu.quant.cross_layer`), before depthwise equalization;
    off by default: its gain shows after the weight refit (not on the plain program the equalize
    judge weighs), and not on every model (the quantization guide's figures).
    `input_grid` (INT8, with samples or a test input, asymmetric not False): where their values
    at the stem conv's input lie on at most 256 evenly spaced levels per channel (pixels
    normalized per channel), the conv reads those levels exactly: computed in float, cast to INT8
    without rounding, the step and origin folded into the conv (`tftpu.quant.input_grid`; the
    model lowered and checked is the rewritten one, the same in float; `result.input_grid` says
    what was done or why not). `reader_ranges` (INT8, on by default): each tensor that only
    saturating functions read has its range clipped to where they still change
    (`tftpu.quant.saturation.clip_to_readers`; `result.reader_ranges` says which). `checks=False`
    (nothing to write) leaves the test input's checks (verify, the simulator) to
    `result.run_checks()`: a program built to be weighed, not kept, skips them (a calibration
    choice builds several and checks the one it keeps). A calibration table with alternates (`calibrate(..., method="mse,tail_mse")`, tftpu-calibrate's
    default) and a test input: the program is built with the first table and, where it misses the
    target (`mixed_precision`'s, else 0.99 / 20 dB) on the test input and samples, with the next
    and the first's choices (`choices_of`), searched again only near the best
    (`tftpu.pipelines.calibration_choice`), the best kept and written (`result.calibration`
    says); without a test input, with the first."""
    call = dict(locals())                 # (the arguments, to deploy again with each table)
    from tftpu.backend import estimate
    from tftpu.ir.module import TopModel, TpuModel, load
    from tftpu.quant.qtable import read_qtable
    from tftpu.quant.table import read_table
    from tftpu.transforms.lowering import lower
    from tftpu.utils.files import check_writable

    t0 = time.perf_counter()
    seconds = {}
    if not isinstance(quantize, str):
        raise errors.UsageError(f"--quantize={quantize!r}: expected one of {', '.join(DEFAULT_TOLERANCE)}")
    check_choices(space_to_depth=space_to_depth, bias_correction=bias_correction, weight_rounding=weight_rounding,
                  float_tail=float_tail, weight_refit=weight_refit, conv_links=conv_links, input_grid=input_grid,
                  reader_ranges=reader_ranges, checks=checks)
    check_choices(AUTO, equalize=equalize)
    check_choices((None, True, False, "auto"), asymmetric=asymmetric)
    mode = quantize.upper()
    if isinstance(wide_links, set):             # (a set of names as given: held as a frozenset)
        wide_links = frozenset(wide_links)
    if calibration_table is not None and not isinstance(calibration_table, (str, Path, CalibrationTable)):
        raise errors.UsageError(f"calibration_table={calibration_table!r}: expected a file path or a "
                                "CalibrationTable (tftpu.quant.calibrate)")
    if refit_rounding not in ("auto",) + REFIT_ROUNDINGS:
        raise errors.UsageError(f"refit_rounding={refit_rounding!r}: expected one of "
                                f"{', '.join(('auto',) + REFIT_ROUNDINGS)}")
    if wide_links not in (True, False, "tables", "convs", "auto") and not isinstance(wide_links, (set, frozenset)):
        raise errors.UsageError(f"wide_links={wide_links!r}: expected True, False, 'tables', 'convs', 'auto' "
                                "or a set of conv names")
    links = True if wide_links == "auto" else wide_links      # what the search and the builds use
    if mixed_precision_latency is not None and not (isinstance(mixed_precision_latency, (int, float, np.number))
                                                    and mixed_precision_latency >= 1.0):
        raise errors.UsageError(f"mixed_precision_latency={mixed_precision_latency!r}: expected a ratio >= 1 to the "
                                "all-INT8 program's estimated latency (inf or None: no limit)")
    if mode not in DEFAULT_TOLERANCE:
        raise errors.UsageError(f"--quantize={quantize}: expected one of {', '.join(DEFAULT_TOLERANCE)}")
    tol = parse_tolerance(tolerance) if tolerance is not None else DEFAULT_TOLERANCE[mode]
    the_chip = chips.load(chip)
    top_model = mlir if isinstance(mlir, TopModel) else load(mlir)
    if isinstance(top_model, TpuModel):
        raise errors.ModelFileError(mlir, "is already a TPU module: tftpu-deploy takes a TOP .mlir")
    _check_wide_weights(top_model, wide_links)
    table = read_table(calibration_table) if isinstance(calibration_table, (str, Path)) else calibration_table
    if mode == "INT8" and table is not None and table.alternates:
        if test_input is not None and not _probe:
            return _deploy_each(call, top_model, table)
        table = table.tables()[table.method]
    if quantize_table is not None and not isinstance(quantize_table, (str, Path, dict)):
        raise errors.UsageError(f"quantize_table={quantize_table!r}: expected a file path or a dict of op name -> "
                                "mode")
    qtable = read_qtable(quantize_table) if isinstance(quantize_table, (str, Path)) else quantize_table
    if asymmetric is None:          # the table's: its calibrated asymmetric ranges, where it holds them
        asymmetric = "auto" if mode == "INT8" and table is not None and table.asymmetric else False
    inputs = _inputs(top_model, test_input)
    check_equalize(equalize)
    check_cross_layer(cross_layer)
    equalized = crossed = None
    equalized_kept = False
    if (equalize or cross_layer) and mode == "INT8" and table is not None and samples:
        from tftpu.quant.calibrate import CALIBRATION_METHODS
        method = table.method if table.method in CALIBRATION_METHODS else "mse"
    if cross_layer and mode == "INT8" and table is not None and samples:
        crossed = cross_layer_step(top_model, table, samples, inputs if inputs is not None else samples[0],
                                   method, asymmetric)
        if crossed is not None:
            top_model, table = crossed.model, crossed.table
            seconds["cross-layer equalization"] = crossed.seconds
    if equalize and mode == "INT8" and table is not None and samples:
        equalized = equalize_step(top_model, table, samples, inputs if inputs is not None else samples[0], the_chip,
                                  asymmetric, method, equalize)
        if equalized is not None:
            equalized_kept = equalized.model is not top_model
            top_model, table = equalized.model, equalized.table
            seconds["equalize"] = equalized.seconds
    clipped, calibrated = None, table
    if reader_ranges and mode == "INT8" and table is not None:
        from tftpu.quant.saturation import clip_to_readers
        t1 = time.perf_counter()
        table, clipped = clip_to_readers(top_model, table)
        seconds["reader ranges"] = time.perf_counter() - t1
    reference = _reference(top_model, test_reference)
    if reference is not None and inputs is None:
        raise errors.UsageError("--test_reference needs --test_input")
    outputs = [p for p in (tpu_mlir, report, model, trace) if p is not None]
    if outputs:
        check_writable(*outputs)
    seconds["load"] = time.perf_counter() - t0
    s2d_result = None
    if space_to_depth:
        from tftpu.transforms.pipeline import run_pipeline
        from tftpu.transforms.space_to_depth import SpaceToDepthPass
        t1 = time.perf_counter()
        original = top_model
        top_model = top_model.copy()
        s2d_result, = run_pipeline(top_model, [SpaceToDepthPass(chip=the_chip.path or the_chip.name)])
        if table is not None:
            table = _entries_for_moves(top_model, table)
        seconds["space-to-depth"] = time.perf_counter() - t1
    grid_line, grid_ops = None, set()
    if input_grid and mode == "INT8" and table is not None and asymmetric is not False and (samples or inputs):
        from tftpu.quant.input_grid import exact_input_grid
        from tftpu.transforms.lowering.lower import float_mode_of
        t1 = time.perf_counter()
        top_model, table, grid = exact_input_grid(top_model, table, ([inputs] if inputs is not None else [])
                                                  + [s for s in (samples or []) if s is not inputs], asymmetric)
        grid_line = grid.line
        if grid.applied:                          # the levels computed in float, cast to INT8 exactly
            grid_ops = set(grid.float_ops)
            qtable = {**(qtable or {}), **dict.fromkeys(grid_ops, float_mode_of(the_chip))}
        seconds["input grid"] = time.perf_counter() - t1
    rounded = rounding = None
    fitting = mode == "INT8" and table is not None and (samples or inputs is not None)
    refitting = weight_refit and fitting
    if weight_rounding and fitting and not refitting:
        if _rounded is not None:                 # (a probe's: the same rounding of the same model)
            rounded, rounding = _rounded[0], dataclasses.replace(_rounded[1])
        else:
            rounded, rounding = _round_weights(top_model, samples or [inputs],
                                               _float_ops(top_model, qtable, float_tail))
        seconds["weight rounding"] = rounding.seconds
    priced = int8_us = None                      # dense convs on 16 bits: their price; the 8-bit program's latency
    offer = limit = whole_limit = None           # the dense convs' ranking; their limit, and all INT8's
    float_latency = mixed_precision_latency      # what the search's float ops may cost on top of the links
    pool = ([inputs] if inputs is not None else []) + [s for s in (samples or []) if s is not inputs]
    if mixed_precision in (None, "none", "") or mode != "INT8":
        mixed_precision = None
    elif mixed_precision == "auto":
        mixed_precision = AUTO_TARGET if inputs is not None or samples else None
    @functools.cache
    def references() -> References:
        """TOP on `pool` (what verify judges: the test input first), run once for the conv links,
        the search and the judge."""
        with span("TOP references", inputs=len(pool)):
            return References(top_model, pool, dumped=RANK_SAMPLES if mixed_precision and not _probe else 0)

    @functools.cache
    def the_judge() -> _Judge:
        """The conv links' and the corrections' measure (one, so a program judged twice runs once)."""
        return _Judge(top_model, pool, references())

    int8_known = (None, None)      # (worst figures as the search judges, latency) of all INT8, 8-bit conv inputs
    inputs_note = base_plain = None
    need = parse_target(mixed_precision or AUTO_TARGET)[1]      # (the SQNR target the links are priced for)
    if wide_links == "auto" and mode == "INT8" and table is not None:
        t1 = time.perf_counter()
        with span("input links"):
            links, inputs_note, eight_us, inputs_us, base_plain = input_links(
                top_model, the_chip, table, qtable, asymmetric, float_tail, mixed_precision_latency or LATENCY_BUDGET,
                the_judge() if pool else None, need, searching=bool(mixed_precision))
        if isinstance(links, InputConvs):        # their price counts against the float ops' budget
            int8_us = eight_us
            if float_latency is not None:
                float_latency = max(1.0, float_latency * eight_us / inputs_us)
        seconds["input links"] = time.perf_counter() - t1
    base_links = links                           # the default links, the model input's where they are taken
    reach = None
    if _probe:                                   # (`all_int8_reach`)
        from tftpu.pipelines.calibration_choice import Reach
        if not (mode == "INT8" and table is not None and pool):
            return None
        base_plain = base_plain or lower(top_model, the_chip, mode, table, qtable=qtable, asymmetric=asymmetric,
                                         wide_links=links, float_tail=float_tail)
        reach = Reach(tuple(the_judge()(base_plain[0])))
        if not (_probe == "rounded" and fitting and (weight_rounding or weight_refit) and wide_links == "auto"
                and conv_links and need - ROUNDED_PROBE_MARGIN <= min(reach.plain) < need):
            return reach
    base_latency = float_latency                 # what the float ops may cost on top of them

    if wide_links == "auto" and conv_links and mode == "INT8" and table is not None and pool:
        t1 = time.perf_counter()
        plain = base_plain or lower(top_model, the_chip, mode, table, qtable=qtable, asymmetric=asymmetric,
                                    wide_links=links, float_tail=float_tail)
        reached = min(the_judge()(plain[0]))
        if rounded is None:                       # the search's own all-INT8 program with these links
            int8_known = (the_judge().worst(plain[0], inputs is not None), None)
        if reached >= need:
            priced = f"dense convs read 8 bits: all INT8 reaches {reached:.1f} dB (target {need:g} dB)"
        else:
            whole_limit = mixed_precision_latency or CONV_LINKS_LATENCY     # (all INT8's, without float ops)
            limit = min(CONV_LINKS_LATENCY, whole_limit)
            if isinstance(base_links, InputConvs):      # (against the program with an 8-bit input too)
                limit *= eight_us / inputs_us
                whole_limit *= eight_us / inputs_us
            with span("conv links"):
                offer = rank_conv_links(top_model, the_chip, table, qtable, asymmetric, float_tail, pool[0], plain,
                                        (references().dumps(1) or [None])[0], base_links)
            links, priced, plain_us, links_us = (offer.within(limit) if offer is not None
                                                 else (base_links, None, None, None))
            if float_latency is not None and links_us:
                float_latency = max(1.0, float_latency * plain_us / links_us)
            if rounded is None and plain_us is not None:
                int8_known = (int8_known[0], plain_us)
            int8_us = int8_us or plain_us
        seconds["conv links"] = time.perf_counter() - t1
    if reach is not None:                        # the rounded probe: all INT8 with those links, GPTQ's weights
        weights = _round_weights(top_model, samples or [inputs], _float_ops(top_model, qtable, float_tail))
        program = lower(_restored(weights[0], top_model, qtable, float_tail), the_chip, mode, table, qtable=qtable,
                        asymmetric=asymmetric, wide_links=links, float_tail=float_tail)[0]
        return dataclasses.replace(reach, rounded=tuple(the_judge()(program)), weights=weights)
    search = None
    rival = None                                 # the isolated ranking's result, built and judged below
    dropped = None                               # the dense convs' 16-bit inputs, where the search gave them up
    if mixed_precision:
        from tftpu.transforms.lowering.search import search_mixed_precision
        # what verify then judges: the test input and the samples, pooled; the test input alone too
        if not pool:
            raise errors.UsageError("--mixed_precision needs --test_input (or samples) to measure with")
        t1 = time.perf_counter()
        def search_by(ranking: str, links=links, latency_budget=float_latency):
            with span("mixed precision search", ranking=ranking):
                return search_mixed_precision(top_model, the_chip, table, pool, mixed_precision,
                                              asymmetric=asymmetric, qtable=qtable, ranking=ranking,
                                              weights_from=rounded, float_budget=mixed_precision_budget,
                                              wide_links=links, float_tail=float_tail,
                                              latency_budget=latency_budget,
                                              latency=lambda m: program_profile(m, the_chip).latency_us,
                                              judge_first=inputs is not None, references=references(),
                                              int8_known=int8_known if links is base_links else (None, None))
        search = search_by(mixed_precision_ranking)
        if _give_up is not None and not search.met and _give_up():
            from tftpu.pipelines.calibration_choice import GaveUp
            raise GaveUp(search.reached[1])     # (another table's all-INT8 program meets the target)
        if wide_links == "auto" and links is not base_links and not search.met:
            # the dense convs' 16-bit inputs took latency the float ops may need (measured: PP-OCRv6
            # met the target without them, not with them): the search once more with 8-bit conv
            # inputs and the whole latency budget, the one that reaches more kept
            eight = search_by(mixed_precision_ranking, base_links, base_latency)
            taken = eight.reached[1] > search.reached[1]
            priced += (f"; the float ops then reach {search.reached[1]:.2f} dB (worst part), with 8-bit conv "
                       f"inputs and the whole latency budget {eight.reached[1]:.2f} dB: "
                       + ("8-bit conv inputs kept" if taken else "16-bit inputs kept"))
            if taken:
                dropped = links
                links, search, float_latency = base_links, eight, base_latency
        # under auto, the gain ranking's float set is weighed against the isolated ranking's on the
        # weights finally lowered (after the refit, which the search does not see); the better is kept
        if mixed_precision_ranking == "auto" and search.ranking == "gain" and search.kept and inputs is not None:
            rival = search_by("isolated", links, float_latency)
            if rival.qtable == search.qtable:           # the same float set needs no second build
                rival = None
        given_qtable, qtable = qtable, search.qtable
        references().drop_dumps()                # (every tensor of a few samples: the rankings' alone)
        seconds["mixed precision search"] = time.perf_counter() - t1
    judge = None
    target = parse_target(mixed_precision or AUTO_TARGET)[1]
    correcting = (bias_correction or refitting) and fitting

    def interpolates(q) -> bool:
        """Whether the interpolated tables change a grid of the program lowered with quantize table `q`."""
        return _interpolated(top_model, table, q, asymmetric, float_tail)

    # under "auto", the program is also built with interpolated tables where they change a grid (of
    # the float set chosen, or of all INT8 where the search kept float ops)
    trying_tables = wide_links == "auto" and links is base_links and mode == "INT8" and table is not None and (
        interpolates(qtable) or search is not None and bool(search.kept) and interpolates(given_qtable))
    if inputs is not None and (rounded is not None or correcting or search is not None and search.kept
                               or trying_tables):
        judge = the_judge()                                    # what verify judges

    settled: list = []     # (refit, kept, check) of the first build's correction, which the trials take as given
    ahead = _Ahead(AHEAD_WORKERS if correcting and judge is not None and pool_size() > 1 else 0)

    def correction_key(how: bool | str, q, links) -> tuple:
        """What the correction `how` of the program with quantize table `q` and `links` depends on:
        (how, its float ops, those without the decode tail, the links' kind, the links)."""
        return (how, frozenset(_float_ops(top_model, q, float_tail)), frozenset(_float_ops(top_model, q, False)),
                type(links), links)

    def correction(key: tuple):
        """((weights lowered, report), seconds) of the correction `correction_key` names (`build`'s `attempt`)."""
        from tftpu.quant.bias_correction import INPUT_BUDGET, MAX_SAMPLES as MAX_FIT_SAMPLES, correct_biases
        how, float_ops, searched, _, links = key
        t1 = time.perf_counter()
        lowered = top_model
        if rounded is not None:
            from tftpu.quant.weight_rounding import restore_weights
            lowered = restore_weights(rounded, top_model, set(float_ops))
        # the ops a refit leaves as given: the decode tail (float by design); plain bias
        # correction, the refit's fallback, leaves every float op so (measured: the face
        # detector's float ops corrected by their mean shift alone lost 1 dB on its test photo)
        fixed = float_ops if not how else float_ops - searched
        with span("weight refit" if how else "bias correction", rounding="gptq" if how == "gptq" else "nearest",
                  float_ops=len(float_ops)):
            done = correct_biases(lowered, table, fit_samples or samples or [inputs], asymmetric=asymmetric,
                                  max_samples=REFIT_SAMPLES if how else MAX_FIT_SAMPLES,
                                  float_ops=set(float_ops), fixed=set(fixed), wide_links=links, refit=bool(how),
                                  rounding="gptq" if how == "gptq" else "nearest",
                                  input_budget=REFIT_INPUTS if how else INPUT_BUDGET)
        return done, time.perf_counter() - t1

    def expect(how: bool | str, q, links) -> None:
        """The correction `how` of a program to be built (`q`, `links`), started on a worker."""
        key = correction_key(how, q, links)
        ahead.submit(key, lambda: correction(key))

    def build(q, notes_of_rounding, links=links, given=None):
        """(TPU model, lowering, weights lowered, bias-correction report) for quantize table `q`:
        the rounded and bias-corrected (or refit) weights, kept only where the outputs verify
        judges do not lose; a refit gives way to plain bias correction where that does better.
        `given` (refit, kept, check): that correction, neither weighed against the other nor judged."""
        plain: list = []

        def attempt(refit_now: bool | str):
            """The build with plain bias correction (False), a refit (True) or a refit whose
            weights are rounded by GPTQ ("gptq")."""
            lowered, corrected = top_model, None
            if correcting and (given is None or given[1]):  # a refit fits the convs to their INT8 inputs
                key = correction_key(refit_now, q, links)
                (lowered, corrected), took = ahead.take(key, lambda: correction(key))
                what = "weight refit" if refit_now else "bias correction"
                seconds[what] = seconds.get(what, 0.0) + took
            elif rounded is not None:
                lowered = _restored(rounded, top_model, q, float_tail)
            t1 = time.perf_counter()
            with span("lower"):
                tpu_model, lowering = lower(lowered, the_chip, mode, table, qtable=q, asymmetric=asymmetric,
                                            wide_links=links, float_tail=float_tail)
                tpu_model.verify()
            seconds["lower"] = seconds.get("lower", 0.0) + time.perf_counter() - t1
            reports = [r for r in (notes_of_rounding, corrected) if r is not None]
            if given is not None and corrected is not None:
                quoted = " (the check of the program this one was weighed against; not judged again)"
                corrected.check = given[2] if given[2].endswith(quoted) else given[2] + quoted
            elif reports and judge is not None:
                t1 = time.perf_counter()
                if not plain:
                    plain.append(lower(top_model, the_chip, mode, table, qtable=q, asymmetric=asymmetric,
                                       wide_links=links, float_tail=float_tail))
                if not _keep_correction(judge, tpu_model, plain[0][0], reports, target):
                    (tpu_model, lowering), lowered = plain[0], top_model
                    tpu_model.verify()
                seconds["keep check"] = seconds.get("keep check", 0.0) + time.perf_counter() - t1
            return tpu_model, lowering, lowered, corrected

        if given is not None:
            return attempt(given[0])
        def better(built, how, instead: str):
            """`built`, or the build with correction `how` where that one is kept and judged
            better (its check then quoting `built`'s, as `instead`)."""
            other = attempt(how)
            if other[3].kept and (not built[3].kept or min(judge(other[0])) > min(judge(built[0]))):
                other[3].check += f" ({instead} {built[3].check})"
                return other
            return built

        first = "gptq" if refitting and refit_rounding == "gptq" else bool(refitting)
        gptq_duel = refitting and refit_rounding == "auto" and judge is not None
        plain_duel = refitting and bias_correction and judge is not None
        if correcting:                                  # the duel's rivals, computed beside the first
            for how in [h for h, duel in (("gptq", gptq_duel), (False, plain_duel)) if duel and h != first]:
                expect(how, q, links)
        built = attempt(first)
        if gptq_duel and built[3] is not None and built[3].refit:
            built = better(built, "gptq", "rounded to nearest:")      # the refit rounded by GPTQ
        if plain_duel:
            built = better(built, False, "weight refit")               # plain bias correction
        if built[3] is not None and rounded is None and not settled:
            settled.append(_given(built[3]))
        return built

    def trial(q, links=links, own: bool = False, given=None):
        """build(q) with its own copy of the rounding report (which the guard writes its verdict
        on), for a float set weighed against the one built: with the correction that one took
        (the trials differ by a few ops; each correction's own choice and check cost as much as
        the search), or, `own`, with a choice and check of its own, or `given` (`_given`)"""
        notes = dataclasses.replace(rounding) if rounding is not None else None
        return build(q, notes, links, given or (None if own or not settled else settled[0])), notes

    with ahead:
        tpu_model, lowering, lowered, corrected = build(qtable, rounding)
        # the trials' corrections whose inputs are known once the first program is built start on a
        # worker, so they run beside the trials before them (each the computation the trial makes)
        trial_how = settled[0][0] if settled and settled[0][1] else None
        if trial_how is not None and search is not None and search.kept:
            expect(trial_how, given_qtable, dropped or links)                       # the float check's
            if offer is not None and whole_limit > limit and min(judge(tpu_model)) < target:
                wider_links = offer.within(whole_limit)[0]
                if wider_links is not base_links:
                    expect(trial_how, given_qtable, wider_links)                    # all INT8, the whole budget's links
        if rival is not None:                        # judge is set: the search kept ops, given a test input
            other, rival_rounding = trial(rival.qtable)
            mine, theirs = judge(tpu_model), judge(other[0])
            chose = min(theirs) > min(mine)
            note = (f"ranking {search.ranking}'s float ops judged {min(mine):.2f} dB on the weights lowered, "
                    f"{rival.ranking}'s {min(theirs):.2f} dB: {rival.ranking if chose else search.ranking}'s kept")
            if chose:
                tpu_model, lowering, lowered, corrected = other
                rounding, search, qtable = rival_rounding, rival, rival.qtable
            search.rival = note
        if correcting and judge is not None and search is not None and len(search.kept) >= TRIM_MIN_OPS:
            # the refit mends INT8 noise the search measured before it: the float ops it ranked last
            # may no longer pay, so they go back to INT8 where the judge holds (the prune of grow and
            # prune, on the weights lowered)
            n = len(search.kept) - max(1, round(TRIM_SHARE * len(search.kept)))
            back = {name for name, _, _ in search.kept[n:]}
            trimmed = {k: v for k, v in search.qtable.items() if k not in back}
            other, trim_rounding = trial(trimmed)
            mine, theirs = judge(tpu_model), judge(other[0])
            taken = _holds(theirs, mine, target)
            note = (f"the last {len(back)} of {len(search.kept)} float ops in the ranking back in INT8: judged "
                    f"{min(theirs):.2f} dB on the weights lowered against {min(mine):.2f} dB, "
                    + ("taken" if taken else "not taken"))
            if taken:
                tpu_model, lowering, lowered, corrected = other
                rounding, qtable = trim_rounding, trimmed
                search = dataclasses.replace(search, qtable=trimmed, kept=search.kept[:n])
            search.trimmed = note
        pure = None                                  # the program all in INT8, where it was lowered
        # a correction the float set did not keep may still pay all in INT8, where the noise it
        # mends is (PP-OCRv3's text detector: all INT8 14.2 dB uncorrected, 16.8 dB refit), so the
        # all-INT8 trials then choose and check theirs again
        all_own = bool(settled) and not settled[0][1]
        if search is not None and search.kept and judge is not None:
            t1 = time.perf_counter()                 # the float ops must beat what mixed_precision="none" makes
            # (with the dense convs' 16-bit inputs the search gave up, as mixed_precision="none" keeps
            # them: judged before the refit, they may still pay after it; PP-OCRv4 14.3 -> 17.6 dB)
            pure, pure_rounding = trial(given_qtable, dropped or links, own=all_own)
            undone = _float_ops_fail(judge(tpu_model), judge(pure[0]), target)
            if undone is not None:
                tpu_model, lowering, lowered, corrected = pure
                rounding = pure_rounding
                if dropped is not None:
                    links, trying_tables = dropped, False
                search = _undone(search, given_qtable, undone)
                qtable = search.qtable
            pure = pure[:2]
            seconds["float check"] = time.perf_counter() - t1
        floats = search is not None and bool(search.kept)
        if offer is not None and judge is not None and whole_limit > limit and min(judge(tpu_model)) < target:
            # all INT8 may spend the float ops' share of the latency on more 16-bit conv inputs: built
            # so with the correction it took, the better kept (measured: PP-OCRv4's text detector 26 ->
            # 34 of 37 convs, 17.6 -> 20.8 dB on its test photo; PP-OCRv6's 34 -> 36 fell 18.9 -> 12.5);
            # where float ops were kept and still miss the target, that program is weighed against
            # them as the float check weighs all INT8 (the full palm detector: 19.6 -> 21.9 dB)
            t1 = time.perf_counter()
            wider = offer.within(whole_limit)
            if floats and wider[0] is not base_links:
                other, other_rounding = trial(given_qtable, wider[0], own=all_own)
                mine, theirs = judge(tpu_model), judge(other[0])
                undone = _float_ops_fail(mine, theirs, target)
                priced += (f"; all INT8 with the whole latency budget, {wider[1]}: judged {min(theirs):.2f} dB on "
                           f"the weights lowered against {min(mine):.2f} dB with the float ops, "
                           + ("taken" if undone is not None else "not taken"))
                if undone is not None:
                    tpu_model, lowering, lowered, corrected = other
                    rounding, links, trying_tables, pure = other_rounding, wider[0], False, other[:2]
                    search = _undone(search, given_qtable, undone)
                    qtable = search.qtable
            elif not floats and wider[0] != links and wider[0] is not base_links:
                other, other_rounding = trial(qtable, wider[0], given=_given(corrected) or (False, False, ""))
                mine, theirs = judge(tpu_model), judge(other[0])
                taken = _holds(theirs, mine, target, strict=True)
                priced += (f"; all INT8 with the whole latency budget, {wider[1]}: judged {min(theirs):.2f} dB on "
                           f"the weights lowered against {min(mine):.2f} dB, " + ("taken" if taken else "not taken"))
                if taken:
                    tpu_model, lowering, lowered, corrected = other
                    rounding, links, trying_tables, pure = other_rounding, wider[0], False, other[:2]
            seconds["conv links, whole budget"] = time.perf_counter() - t1
        tables = None                                # the interpolated tables' trial, under "auto"
        if trying_tables and judge is not None:
            # a fused conv + activation (`wide_links="tables"`) lowers pure INT8's noise, but the float
            # ops were chosen without it: the program is built with it too, and the better kept
            t1 = time.perf_counter()
            taken, tables = False, "activation tables interpolated from 16-bit conv outputs"
            with_tables = frozenset(links) if isinstance(links, InputConvs) else "tables"   # (a set: with the tables)
            if interpolates(qtable):
                other, other_rounding = trial(qtable, with_tables)
                mine, theirs = judge(tpu_model), judge(other[0])
                # (within the latency budget, where the 8-bit program's latency is known: tables cost DMA)
                over = not (int8_us is None or mixed_precision_latency is None or search is None or not search.kept
                            or program_profile(other[0], the_chip).latency_us
                            <= mixed_precision_latency * int8_us * (1 + 1e-9))
                taken = min(theirs) > min(mine) and not over
                tables += (f": judged {min(theirs):.2f} dB on the weights lowered against {min(mine):.2f} dB, "
                           + ("taken" if taken else "not taken" + (" (over the latency budget)" if over else "")))
            else:
                tables += ": they change no grid of the float set kept"
            if taken:
                tpu_model, lowering, lowered, corrected = other
                rounding, links = other_rounding, with_tables
                pure = None                          # the all-INT8 program below is lowered with them too
            if search is not None and search.kept and interpolates(given_qtable):
                # all INT8 with the tables may beat the float ops
                other, other_rounding = trial(given_qtable, with_tables, own=all_own)
                undone = _float_ops_fail(judge(tpu_model), judge(other[0]), target)
                if undone is not None:
                    tpu_model, lowering, lowered, corrected = other
                    rounding, links, pure = other_rounding, with_tables, other[:2]
                    search = _undone(search, given_qtable, undone)
                    qtable = search.qtable
                    tables += f"; all INT8 with them: {min(judge(tpu_model)):.2f} dB, taken"
            seconds["tables check"] = time.perf_counter() - t1
    if search is not None and judge is not None:
        search.tables = tables
        search.lowered = judge(tpu_model)
    # (how a calibration choice weighs this program against another table's, judged the same way)
    judged = (judge or the_judge())(tpu_model) if mode == "INT8" and table is not None and inputs is not None else None
    weights_alone = weights_each = beyond = None
    if judged is not None and min(judged) < target:
        # (what the weights' rounding alone costs, the activations in float: which side the noise is
        # on; the model's own weights rounded to nearest, as a refit's are fitted to INT8 inputs;
        # measured when asked, not for each table a calibration choice builds)
        from tftpu.transforms.lowering.lower import FOUR_PASSES, WIDE_WEIGHTS
        int8_names = {d.name for d in lowering.decisions if d.mode == "INT8"}
        wide_names = {d.name for d in lowering.decisions if d.reason in (WIDE_WEIGHTS, FOUR_PASSES)}

        def weights_alone(judging=judge or the_judge()):
            from tftpu.quant.bias_correction import lowered_weights
            return judging.float_run(lowered_weights(top_model, int8_names, wide_names))

        def weights_each():                      # each conv's weights alone, on the test input
            from tftpu.transforms.lowering.search import weight_rounding_effects
            dump = TopInterpreter(top_model).run(inputs, dump_all=True)
            return weight_rounding_effects(top_model, int8_names, dump, references().floor, wide_names)

        def beyond():                            # the test input's tensors far past their grids
            return _beyond(TopInterpreter(top_model).run(inputs, dump_all=True), calibrated, table, asymmetric,
                           _int8_tensors(top_model, int8_names))
    t1 = time.perf_counter()
    from tftpu.backend import s2d_stem
    from tftpu.backend.codegen import annotate, generate
    from tftpu.backend.profile import profile
    cycles = estimate(tpu_model, the_chip)
    all_int8_us = int8_us                        # (the links' price counts against the float ops' budget)
    if search is not None and search.kept and all_int8_us is None:   # what the float ops cost: all in INT8
        pure = pure or lower(top_model, the_chip, mode, table, qtable=given_qtable, asymmetric=asymmetric,
                             wide_links=links, float_tail=float_tail)
        all_int8_us = program_profile(pure[0], the_chip).latency_us
    program = generate(tpu_model, the_chip)
    annotate(program)                 # addresses and group_info into the module's text
    memory = program.memory
    prof = profile(program)
    seconds["layer groups + memory + codegen"] = time.perf_counter() - t1
    stem = s2d_stem(tpu_model, the_chip)
    if s2d_result is not None:
        applied = bool(s2d_result.changed)
        numbers = (s2d_result.changed or s2d_result.declined)[0]
        stem = {"name": numbers.where, "applied": applied, "reason": numbers.reason,
                "before": None, "after": None}
        if applied:                                    # priced on the rewritten conv, and as it was
            names = producer_names(numbers.where)
            rewritten = [o for o in cycles.ops if o.name in names and o.type == "tpu.Conv"]
            stem["after"] = rewritten[0].cycles if rewritten else None
            issued = numbers.numbers
            if stem["after"] is not None and issued.get("issued_macs_after"):
                stem["before"] = round(stem["after"] * issued["issued_macs_before"] / issued["issued_macs_after"])
            if inputs is not None:                     # the rewritten TOP against the original
                stem["max_rel_diff"] = max_relative_difference(TopInterpreter(original).run(inputs),
                                                               TopInterpreter(top_model).run(inputs),
                                                               original.output_names)
    if all_int8_us is not None and search is not None:
        search.latency_ratio = prof.latency_us / all_int8_us if all_int8_us > 0 else 1.0
    lowering.decisions = [dataclasses.replace(d, reason=GRID_REASON)     # (the quantize table carried them)
                          if d.name in grid_ops and d.mode != "INT8" else d for d in lowering.decisions]
    result = DeployResult(tpu_model, lowering, tol, search=search, memory=memory, cycles=cycles, s2d=stem,
                          program=program, profile=prof, bias_correction=corrected, weight_rounding=rounding,
                          tables=tables,
                          conv_links="; ".join(n for n in (inputs_note, priced) if n) or None, wide_links=links,
                          int8_latency_us=int8_us,
                          equalize=equalized.line if equalized is not None else None, input_grid=grid_line,
                          cross_layer=crossed.line if crossed is not None else None,
                          reader_ranges=clipped.line if clipped is not None else None, judged=judged,
                          equalized=equalized_kept, weights_alone_of=weights_alone,
                          weights_each_of=weights_each, beyond_of=beyond, target_db=target)
    result.seconds = seconds
    if inputs is not None:
        def run_checks(result: DeployResult) -> None:
            t1 = time.perf_counter()
            with span("verify", inputs=len(pool)):
                result.tensors, result.outputs, result.parts = verify(top_model, tpu_model, pool, tol, reference)
            result.reference = "--test_reference" if reference is not None else "TOP"
            result.seconds["verify"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            with span("simulate"):
                result.simulator = check_simulator(program, tpu_model, inputs)
            result.seconds["simulate"] = time.perf_counter() - t1

        result.pending_checks = run_checks
        if checks or outputs:
            result.run_checks()
    _write(result, tpu_mlir=tpu_mlir, model=model, trace=trace, report=report)
    return result


GRID_REASON = "input grid: the image's levels computed in float, cast to INT8 exactly"


def _int8_tensors(top_model, int8_ops: set) -> set:
    """The tensors of `top_model` that the INT8 ops `int8_ops` (by loc) write or read: those the
    program holds on an 8-bit grid (a float op's tensors, a decode tail's, hold no grid)."""
    return {value_name(v) for op in top_model.ops if op.loc in int8_ops
            for v in (*op.results, *op.operands) if not isinstance(v.owner, top.Weight)}


def _beyond(dump: dict, calibrated, table, asymmetric, held=None) -> list[tuple[str, float, float]]:
    """(name, value, the grid's end) of each tensor of `dump` at least `BEYOND_RANGE` times past the
    8-bit grid of its `calibrated` entry, furthest first; a tensor whose range `table` clipped to
    its saturating readers is left out (past that range its readers no longer change), and one not
    in `held` (the tensors the program holds on a grid; None: all)."""
    rows = []
    for name, entry in calibrated.entries.items():
        x = dump.get(name)
        if held is not None and name not in held:
            continue
        if x is None or table.entries.get(name) != entry or np.asarray(x).dtype.kind != "f" or not np.size(x):
            continue
        lo, hi = map(float, P.activation(*entry[:3], asymmetric=asymmetric).dequantize([-128, 127]))
        ends = [(v / end, v, end) for v, end in ((float(np.max(x)), hi), (float(np.min(x)), lo)) if v * end > 0]
        far = max(ends, default=(0.0,))
        if far[0] >= BEYOND_RANGE:
            rows.append((far[0], name, *far[1:]))
    return [(name, v, b) for _, name, v, b in sorted(rows, key=lambda r: (-r[0], r[1]))]


def _check_wide_weights(top_model, links) -> None:
    """A UsageError where `links` gives 16-bit weights (`WideWeights`) to an op that is not a
    conv with constant weights in `top_model`."""
    from tftpu.quant.links import wide_weights
    convs = {op.loc for op in top_model.ops
             if isinstance(op, top.Conv) and isinstance(op.operands[1].owner, top.Weight)}
    unknown = sorted(wide_weights(links) - convs)
    if unknown:
        shown = ", ".join(sorted(convs)[:5]) + (" ..." if len(convs) > 5 else "")
        raise errors.UsageError(f"16-bit weights for {unknown[0]!r}: no conv with constant weights has that name "
                                f"(the model's: {shown or 'none'})")


def _write(result: DeployResult, *, tpu_mlir=None, model=None, trace=None, report=None) -> None:
    """Write what `deploy` was asked for: the TPU module, the model file, the trace, the report."""
    seconds = result.seconds
    if tpu_mlir is not None:
        t1 = time.perf_counter()
        result.mlir, result.weights = result.model.save(tpu_mlir)
        seconds["save"] = time.perf_counter() - t1
    if model is not None:
        from tftpu.backend import tpumodel
        t1 = time.perf_counter()
        prof = result.profile
        result.model_file = tpumodel.save(result.program, model, meta={"estimate": {
            "latency_us": round(prof.latency_us, 3), "flops": prof.flops, "utilisation": round(prof.utilisation, 6)}})
        seconds["write model file"] = time.perf_counter() - t1
    if trace is not None:
        result.profile.write_trace(trace)
        result.trace = Path(trace)
    if report is not None:
        from tftpu.pipelines.deploy_report import write_report
        write_report(report, result)


def all_int8_reach(mlir, *, rounded: bool = False, **kwargs):
    """The `calibration_choice.Reach` of the program `deploy(mlir, **kwargs)` starts its search
    from: (pooled, test input alone) worst SQNR all in INT8, uncorrected, with the model input's
    links it takes; None where it judges nothing (not INT8, no table, no test input or samples).
    A build's first steps only: what a calibration choice asks of another table where the first
    one's search misses. `rounded`: where that misses the target by at most
    `ROUNDED_PROBE_MARGIN` dB (and the build may correct its weights and price the dense convs'
    16-bit inputs), that program is judged once more with those inputs and its INT8 weights
    rounded by GPTQ (`Reach.rounded`, and `Reach.weights`, the rounding: `deploy(...,
    weight_rounding=True, _rounded=it)` builds with it)."""
    return deploy(mlir, **{**kwargs, "checks": False, "_probe": "rounded" if rounded else True, "_give_up": None})


def rounded_args(weights) -> dict:
    """`deploy`'s arguments that build all INT8 with the weights a rounded probe met the target
    with (`Reach.weights`): GPTQ's rounding kept as it is, no refit or bias correction after it."""
    return {"weight_rounding": True, "weight_refit": False, "bias_correction": False, "_rounded": weights}


def _deploy_each(call: dict, top_model, table) -> DeployResult:
    """`deploy` with each of `table`'s tables in turn (`try_tables`), what it was asked to write
    written for the one kept."""
    from tftpu.pipelines.calibration_choice import target_of, try_tables
    from tftpu.utils.files import check_writable

    writes = {k: call[k] for k in ("tpu_mlir", "report", "model", "trace")}
    if any(p is not None for p in writes.values()):
        check_writable(*(p for p in writes.values() if p is not None))
    once = {**call, "mlir": top_model, **dict.fromkeys(writes), "checks": False}      # (the one kept is checked)
    tried = try_tables(table.tables(),
                       lambda m, t, give_up=None, rounded=None: (deploy(**{
                           **once, "calibration_table": t, "_give_up": give_up,
                           **(rounded_args(rounded) if rounded is not None else {})}),),
                       target_of(call["mixed_precision"]), _LOG.info,
                       like=lambda m, t, first, was: (carried(deploy(**{**once, "calibration_table": t,
                                                                       **choices_of(first[-1])}), first[-1], was),),
                       probe=lambda m, t: all_int8_reach(**{**once, "calibration_table": t}, rounded=True))
    result = tried.built[-1]
    if call["checks"] or any(p is not None for p in writes.values()):
        result.run_checks()
    result.calibration = tried
    result.seconds["calibration choice"] = tried.others_seconds
    _write(result, **writes)
    return result


def _interpolated(top_model, table, qtable, asymmetric, float_tail: bool = True) -> bool:
    """Whether `wide_links="tables"` changes a grid of `top_model` lowered with `qtable`: an INT8
    smooth activation table then reads a conv, Add, Mul, ... (an LSTM's gate) on 16 bits."""
    from tftpu.quant.links import wide_grids
    float_ops = _float_ops(top_model, qtable, float_tail)
    grids = [wide_grids(top_model, table, asymmetric, lambda name: name not in float_ops, tables=tables)
             for tables in (False, True)]
    return grids[0] != grids[1]


def _round_weights(top_model, samples: list, float_ops: set) -> tuple:
    """(copy of `top_model` with its INT8 ops' weights rounded by GPTQ on `samples`, its report)."""
    from tftpu.quant.weight_rounding import reconstruct_rounding
    with span("weight rounding", float_ops=len(float_ops)):
        return reconstruct_rounding(top_model, samples, float_ops=float_ops)


def _restored(rounded, top_model, qtable, float_tail: bool = True):
    """`rounded` (`_round_weights`) with the float ops of `qtable` (and the decode tail) given
    their own weights back: what the program with quantize table `qtable` lowers."""
    from tftpu.quant.weight_rounding import restore_weights
    return restore_weights(rounded, top_model, _float_ops(top_model, qtable, float_tail))


def _float_ops(top_model, qtable, float_tail: bool = True) -> set:
    """The ops a quantize table keeps out of INT8, and (`float_tail`) those of the decode tail it
    does not name (which the lowering runs in float by design)."""
    qtable = qtable or {}
    tail = decode_tail(top_model) if float_tail else {}
    return {name for name, m in qtable.items() if str(m).upper() != "INT8"} | \
        {name for name in tail if name not in qtable}


class _Ahead:
    """Corrections started on workers before the build that takes them (their inputs known ahead:
    the duel's rivals, the trials' refits), so they run beside the builds and judgements before
    them. Each is the computation the build would make; one not started yet when its build comes
    is computed there. The BLAS is held to one thread while workers run (as each correction holds
    it): the same sums on any thread."""

    def __init__(self, workers: int):
        self.workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tftpu-ahead") if workers else None
        self.futures: dict = {}
        self.limits = None

    def __enter__(self) -> "_Ahead":
        if self.workers is not None:
            self.limits = threadpool_limits(limits=1, user_api="blas")
        return self

    def __exit__(self, *exc) -> None:
        if self.workers is not None:
            self.workers.shutdown(wait=True, cancel_futures=True)
            self.limits.restore_original_limits()
            self.workers = None

    def submit(self, key, compute) -> None:
        if self.workers is not None and key not in self.futures:
            self.futures[key] = self.workers.submit(compute)

    def take(self, key, compute):
        """`compute()`, or its result computed ahead under `key`."""
        future = self.futures.pop(key, None)
        return compute() if future is None or future.cancel() else future.result()


def _keep_correction(judge: _Judge, corrected_tpu, plain_tpu, reports, target: float = math.inf) -> bool:
    """Whether the corrected TPU model (reconstructed rounding, bias correction) does at least
    as well as the plain one by `judge` (the worse of pooled and the test input alone), and on
    the test input alone as well unless that stays at `target` dB (a correction that the
    calibration photos like but the test input does not is not kept). Notes the figures in each
    of `reports`."""
    before, after = judge(plain_tpu), judge(corrected_tpu)
    kept = _holds(after, before, target)
    alone = f", on the test input alone {before[1]:.2f} -> {after[1]:.2f} dB" if len(judge.held) > 1 else ""
    for report in reports:
        report.kept = kept
        report.check = (f"{'kept' if kept else 'not kept'}: worst output SQNR on {judge.where} "
                        f"{before[0]:.2f} -> {after[0]:.2f} dB{alone}")
    return kept


def _given(corrected) -> tuple | None:
    """(how, kept, check) of a program's correction (a `BiasCorrection` report), for `build` to
    apply the same to another without choosing and checking it again; None where there was none."""
    if corrected is None:
        return None
    return "gptq" if corrected.rounding == "gptq" else bool(corrected.refit), corrected.kept, corrected.check


def choices_of(first: DeployResult) -> dict:
    """`deploy`'s arguments that build a program with another calibration table as `first` was
    built: its float ops (the search's quantize table), its links, its depthwise equalization and
    its correction (refit and its rounding, plain bias correction, or none), none of them searched
    or weighed again (`tftpu.pipelines.calibration_choice`)."""
    corr = first.bias_correction
    refit = corr is not None and corr.kept and bool(corr.refit)
    out = {"mixed_precision": None, "wide_links": first.wide_links, "equalize": first.equalized,
           "weight_refit": refit, "refit_rounding": corr.rounding if refit else "nearest",
           "bias_correction": corr is not None and corr.kept and not corr.refit,
           "weight_rounding": first.weight_rounding is not None and first.weight_rounding.kept}
    if first.search is not None:        # (the stem's input grid ops: deploy adds them where the grid applies)
        grid = {d.name for d in first.lowering.decisions if d.reason == GRID_REASON}
        out["quantize_table"] = {k: v for k, v in first.search.qtable.items() if k not in grid}
    return out


def carried(result: DeployResult, first: DeployResult, method: str) -> DeployResult:
    """`result`, built with `choices_of(first)`, reporting `first`'s search as its own (the same
    float ops), judged on its own weights; `method`: the table `first` was built with."""
    if first.search is not None:
        result.search = dataclasses.replace(
            first.search, lowered=result.judged, trimmed=None, tables=None,
            rival=f"the float ops, links and correction of the program built with the {method} table, "
                  "taken as they are")
    return result


def _undone(search, given_qtable, undone: tuple):
    """`search` with its float ops undone (all INT8 judged better: `undone`'s figures), the quantize
    table given back."""
    return dataclasses.replace(search, qtable=dict(given_qtable or {}), kept=[], undone=undone)


def _float_ops_fail(mixed: tuple, pure: tuple, target: float) -> tuple | None:
    """(mixed, all-INT8) figures where the search's float ops are not worth keeping, judged as the
    correction guard judges (`_Judge`'s (pooled, test input alone) of each program): they must do
    better on the worse of the two, and not worse on the test input alone unless it stays at
    `target` dB. None where they are kept."""
    if _holds(mixed, pure, target, strict=True):
        return None
    return (min(mixed), min(pure)) if min(mixed) <= min(pure) else (mixed[1], pure[1])


def _holds(new: tuple, old: tuple, target: float, strict: bool = False) -> bool:
    """Whether `_Judge` figures `new` hold against `old`: the worse of (pooled, test input alone)
    does not drop (rises, `strict`), and the test input alone does not drop unless it stays at
    `target` dB."""
    worse = min(new) > min(old) if strict else min(new) >= min(old)
    return worse and (new[1] >= old[1] or new[1] >= target)


def _entries_for_moves(model, table):
    """`table` with an entry for each tensor a rewrite added after calibration by moving or
    zero-padding a calibrated one (the S2D input's rearrangement): the source's range, widened
    to hold 0 where it pads. A copy; the table given is left as it is."""
    moves = {"top.Pad", "top.SpaceToDepth", "top.Reshape", "top.Permute", "top.Slice"}
    entries = dict(table.entries)
    for op in model.ops:
        if op.name not in moves or not op.results:
            continue
        out, src = value_name(op.results[0]), value_name(op.operands[0])
        if out in entries or src not in entries:
            continue
        t, lo, hi = entries[src][:3]
        entries[out] = (t, min(lo, 0.0), max(hi, 0.0)) if op.name == "top.Pad" else (t, lo, hi)
    return table if len(entries) == len(table.entries) else dataclasses.replace(table, entries=entries)


def _inputs(model, test_input):
    if test_input is None:
        return None
    from tftpu.ir.weights import load_npz
    from tftpu.utils.inputs import match_inputs, numeric

    if not isinstance(test_input, (str, Path, dict)):
        raise errors.UsageError(f"--test_input {type(test_input).__name__}: expected an .npz path or a dict of arrays")
    arrays = load_npz(test_input) if isinstance(test_input, (str, Path)) else dict(test_input)
    values = match_inputs(model.input_names, arrays)
    out = {}
    for op, arr in zip([op for op in model.ops if isinstance(op, top.Input)], values):
        arr = numeric(op.loc, arr)
        want = tuple(op.output.type.get_shape())
        if tuple(arr.shape) != want:
            raise errors.ShapeError(f"--test_input {op.loc!r} has shape {list(arr.shape)}, the model wants {list(want)}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).any():
            raise errors.InputError(f"--test_input {op.loc!r} has no finite value")
        out[op.loc] = arr
    return out


def _reference(model, test_reference):
    if test_reference is None:
        return None
    from tftpu.ir.weights import load_npz

    if not isinstance(test_reference, (str, Path, dict)):
        raise errors.UsageError(f"--test_reference {type(test_reference).__name__}: expected an .npz path or a dict "
                                "of arrays")
    ref = load_npz(test_reference) if isinstance(test_reference, (str, Path)) else dict(test_reference)
    missing = [n for n in model.output_names if n not in ref]
    if missing:
        raise errors.InputError(f"--test_reference has no tensor {missing[0]!r} (it holds {', '.join(sorted(ref)[:5])})")
    for name, v in zip(model.output_names, model.return_op.operands):
        want, got = tuple(v.type.get_shape()), np.shape(ref[name])
        if int(np.prod(got)) != int(np.prod(want)):
            raise errors.ShapeError(f"--test_reference {name!r} has shape {list(got)}, the model's output is {list(want)}")
    return ref
