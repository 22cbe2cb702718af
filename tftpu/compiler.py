"""`tftpu.compile`: the whole compile path in one call, each stage checked against the one
before, as TPU-MLIR's deploy flow does.

    source (Keras / SavedModel / ONNX / TFLite / .top.mlir)
      -> TOP (checked against onnxruntime on the source's ONNX form)
      -> calibration (INT8)
      -> space-to-depth of the stem, where the chip's cost model gains (checked against TOP)
      -> TPU dialect (checked against TOP: cosine / SQNR per output and per concat part)
      -> layer groups, DDR plan, codegen (the program)
      -> simulator (checked against TPU inference: INT8 bit for bit)

>>> compiled = tftpu.compile(keras_model, chip="npu1", calibration_data=photos)   # doctest: +SKIP
>>> compiled.run({"image": x})                                                     # doctest: +SKIP
>>> compiled.save("model.tpumodel"); compiled.report["latency_us"]                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np

from tftpu import errors
from tftpu.utils.choices import AUTO, check_choices
from tftpu.utils.spans import span
from tftpu.pipelines.calibration_choice import CALIBRATION_DEFAULT, methods_of, target_of, try_tables
from tftpu.pipelines.equalization import check_cross_layer
from tftpu.quant.refit import MAX_SAMPLES as REFIT_SAMPLES
from tftpu.transforms.lowering.search import FLOAT_BUDGET, JUDGE_SAMPLES, LATENCY_BUDGET

__all__ = ["compile", "CompiledModel", "Stage"]

_LOG = logging.getLogger("tftpu.compile")


@dataclasses.dataclass
class Stage:
    """One stage of the compile: what it made, how long it took and how it compares with the
    stage before (`check` is a line for people, `passed` None where nothing was compared)."""

    name: str
    seconds: float
    check: str = ""
    passed: bool | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "seconds": round(self.seconds, 3), "check": self.check, "passed": self.passed}

    def __str__(self) -> str:
        state = "" if self.passed is None else (" ok" if self.passed else " FAILED")
        return f"{self.name} ({self.seconds:.1f} s){': ' + self.check if self.check else ''}{state}"


class CompiledModel:
    """A model compiled for one chip: `.run(inputs)` on the simulated chip, `.save(path)` as a
    `.tpumodel`, `.report` (stages and their checks, latency, FLOPs, utilisation, per-op
    cycles, S2D, memory, layer groups)."""

    def __init__(self, deployed, top_model, stages: list, extra: dict):
        self.deployed = deployed
        self.top_model = top_model
        self.tpu_model = deployed.model
        self.program = deployed.program
        self.stages = stages
        self._extra = extra
        self._simulator = None

    @property
    def chip(self) -> str:
        return self.program.chip.name

    @property
    def input_names(self) -> list[str]:
        return [d["name"] for d in self.program.inputs]

    @property
    def output_names(self) -> list[str]:
        return [d["name"] for d in self.program.outputs]

    @property
    def passed(self) -> bool:
        return all(s.passed is not False for s in self.stages)

    def run(self, inputs) -> dict:
        """Outputs by name from the simulated chip (INT8 outputs as the floats they stand for);
        `inputs` is a dict by input name, or one array for a one-input model."""
        from tftpu.backend.simulator import Simulator

        if self._simulator is None:
            self._simulator = Simulator(self.program)
        if not isinstance(inputs, dict):
            if len(self.input_names) != 1:
                raise errors.UsageError(f"the model has {len(self.input_names)} inputs: pass a dict by name")
            inputs = {self.input_names[0]: inputs}
        return self._simulator.run(inputs, dequantize=True)

    def save(self, path) -> Path:
        """Write the `.tpumodel` (atomically) and return its path."""
        from tftpu.backend import tpumodel

        prof = self.deployed.profile
        return tpumodel.save(self.program, path, meta={"estimate": {
            "latency_us": round(prof.latency_us, 3), "flops": prof.flops, "utilisation": round(prof.utilisation, 6)}})

    def write_trace(self, path) -> None:
        """The program's estimated timeline as Chrome trace-event JSON (Perfetto opens it)."""
        self.deployed.profile.write_trace(path)

    @property
    def report(self) -> dict:
        from tftpu.pipelines.deploy_report import report_data

        data = report_data(self.deployed)
        data["stages"] = [s.as_dict() for s in self.stages]
        data.update(self._extra)
        return data

    def __repr__(self) -> str:
        prof = self.deployed.profile
        return (f"<CompiledModel {self.tpu_model.name} for {self.chip} in {self.tpu_model.mode}: "
                f"{len(self.program.commands)} commands, {prof.latency_us:,.1f} us estimated>")

    def __str__(self) -> str:
        lines = [repr(self)] + [f"  {s}" for s in self.stages]
        return "\n".join(lines)


def _samples(top_model, data, what: str) -> list[dict]:
    """Input dicts for `top_model` from what a user passes (`tftpu.quant.iter_samples`: a
    directory, glob or TFRecord file, a tf.data.Dataset, a dict of arrays, an array, or a list /
    iterable of those)."""
    from tftpu.quant.dataset import iter_samples

    return list(iter_samples(top_model, data, what=what))


def _synthetic(top_model, count: int = 4) -> list[dict]:
    """Deterministic stand-in inputs (uniform in [-1, 1]) for when no data is given."""
    from tftpu.ir import attrs as A
    from tftpu.ir import top

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        sample = {}
        for op in top_model.ops:
            if isinstance(op, top.Input):
                t = op.output.type
                sample[op.loc] = rng.uniform(-1, 1, t.get_shape()).astype(A.numpy_dtype(A.dtype_name(t.element_type)))
        out.append(sample)
    return out


def _import(model, input_shapes) -> tuple:
    """TOP model and the import stage (checked against onnxruntime where the source has an ONNX form)."""
    from tftpu import frontend

    t0 = time.perf_counter()
    kind = frontend.source_kind(model)
    if kind in ("top", "mlir"):
        top_model = frontend.load(model, input_shapes)
        return top_model, None, Stage("import", time.perf_counter() - t0, f"{kind} model read")
    proto = frontend.to_onnx(model, input_shapes)
    name = Path(model).stem if isinstance(model, (str, Path)) else getattr(model, "name", None) or "model"
    top_model = frontend.load(proto, None if kind in frontend.EXPORTED_AT_SHAPES else input_shapes, name=str(name))
    return top_model, proto, Stage("import", time.perf_counter() - t0, f"{kind} -> ONNX -> TOP")


def _check_import(stage: Stage, proto, top_model, sample: dict) -> None:
    from tftpu.frontend.check import onnx_tensors
    from tftpu.interp.similarity import compare_arrays, noise_floor
    from tftpu.interp.top_interpreter import TopInterpreter

    t0 = time.perf_counter()
    ref = onnx_tensors(proto, sample)              # every tensor: their scale sets the noise floor
    got = TopInterpreter(top_model).run(sample)
    floor = noise_floor(ref.values())
    rows = [compare_arrays(n, ref[n], got[n], (0.99, 0.99), floor) for n in top_model.output_names if n in ref]
    if rows:
        worst = min(rows, key=lambda r: (r.passed, r.cosine))
        stage.check += (f"; TOP vs onnxruntime: min output cosine {worst.cosine:.6f}"
                        + (f" ({worst.note})" if worst.note else ""))
        stage.passed = all(r.passed for r in rows)
    stage.seconds += time.perf_counter() - t0


def _equalize(top_model, table, samples, check, chip, asymmetric, method: str, equalize) -> tuple:
    """(TOP model, calibration table, stage or None): `tftpu.pipelines.equalization` on `samples`."""
    from tftpu.pipelines.equalization import equalize_step

    return _step(top_model, table, "equalize",
                 equalize_step(top_model, table, samples, check, chip, asymmetric, method, equalize))


def _cross_layer(top_model, table, samples, check, asymmetric, method: str) -> tuple:
    """(TOP model, calibration table, stage or None): cross-layer equalization on `samples`."""
    from tftpu.pipelines.equalization import cross_layer_step

    return _step(top_model, table, "cross-layer equalization",
                 cross_layer_step(top_model, table, samples, check, method, asymmetric))


def _step(top_model, table, name: str, done) -> tuple:
    """(TOP model, calibration table, stage or None) of an equalization step's `Equalized`."""
    if done is None:
        return top_model, table, None
    return done.model, done.table, Stage(name, done.seconds, done.line, done.passed)


def compile(model, *, chip, quantize: str = "INT8", calibration_data=None,
            calibration_method: str = CALIBRATION_DEFAULT,
            test_input=None, input_shapes=None, space_to_depth: bool = True, asymmetric: bool | str = "auto",
            mixed_precision: str | None = "auto", quantize_table=None, tolerance=None,
            bias_correction: bool = True, weight_rounding: bool = True, weight_refit: bool = True,
            refit_rounding: str = "auto",
            mixed_precision_budget: float | None = FLOAT_BUDGET, mixed_precision_latency: float | None = LATENCY_BUDGET,
            wide_links: bool | str = "auto", float_tail: bool = True, equalize: bool | str = "auto",
            input_grid: bool = True, cross_layer: bool = False, reader_ranges: bool = True,
            log=None) -> CompiledModel:
    """Compile `model` (an ONNX path or ModelProto, a Keras model or file, a SavedModel
    directory, a `.tflite`, a `.top.mlir` path or TopModel) for `chip` (a name such as "npu1" or
    "edge16", or a YAML path) in `quantize` mode (INT8, F16, BF16, F32).

    `calibration_data` (INT8): a directory, a glob or a TFRecord file of images / .npz, a
    `tf.data.Dataset`, a dict of arrays, an array, or a list / iterable of those, streamed with
    bounded memory (`tftpu.quant.iter_samples`: images enter as pixels, mean 0 and scale 1; map
    a tf.data.Dataset to preprocess them); without it a deterministic synthetic set stands in
    and the report says so.
    `calibration_method` (INT8): a `tftpu.quant.calibrate` method, or several joined by commas,
    each giving a table from the same statistics pass: the program is built with the first, and
    where it misses the target (`mixed_precision`'s, else 0.99 / 20 dB) on the test input and
    samples, with the next table and the first's float ops, links and correction, searched again
    with it only where that comes within 3 dB under the best without reaching the target; the
    best kept (`tftpu.pipelines.calibration_choice`). Where the first table's search misses the
    target and a later table's program all in INT8 reaches it (as its search starts, or, within 3 dB
    of the target as it starts, with the dense convs' 16-bit inputs and GPTQ-rounded weights),
    that table is built first instead (with that rounding, where only it reaches the target).
    The default "mse,tail_mse" tries `tail_mse` (clipped values' error counted 64 times) where
    `mse` misses: a detector's objects are the rare large values mse clips.
    `test_input` (default: the first calibration sample) is what every stage is checked on.
    `space_to_depth`: rewrite the stem where the chip's cost model gains (the host then makes the
    space-to-depth input). `asymmetric` (INT8): "auto" gives a zero point to the activations
    whose range is one-sided (ReLU, sigmoid, SiLU outputs: a grid about twice as fine), True to
    every activation, False to none. `bias_correction` (INT8): lower a copy of the model whose
    conv / matmul / deconv biases absorb the mean per-channel INT8 error measured on the
    calibration samples (`tftpu.quant.bias_correction`), kept where the worst output SQNR the
    lower stage reports does not drop; every check still compares against the model as given.
    `weight_rounding` (INT8): round the INT8 conv / matmul weights by per-layer reconstruction on
    the calibration samples (`tftpu.quant.weight_rounding`: each rounding error taken back by the
    weights not rounded yet, GPTQ-style) rather than to nearest, before the mixed-precision
    search, kept on the same condition. `weight_refit` (INT8, in place of `weight_rounding` and
    with bias correction for the other ops): after the search, each INT8 2-D conv's weights and
    bias refit, by ridge-regularized least squares, from the simulated INT8 inputs it gets with
    the float ops chosen to its float output (`tftpu.quant.refit`: AdaQuant's layer-wise fit in
    closed form; a conv kept in float likewise, its weights staying float), kept on the same
    condition. `refit_rounding` (with `weight_refit`): "nearest", "gptq" (the refit weights
    rounded with GPTQ's error feedback, the bias taking back the rounding's mean) or "auto" (both
    built, the better on the test input and samples kept). `mixed_precision_budget`: the most of
    the model's FLOPs the mixed-precision search may keep in float (5% by default: an INT8
    program stays INT8; None or 1: as many as the target needs); where the target needs more, the search keeps what
    fits and reports the target missed. `mixed_precision_latency`: the most the float ops may
    slow the program, as a multiple of its estimated all-INT8 latency (1.15 by default; None: no
    limit), the same way. `wide_links` (INT8): a tensor that
    INT8 Add / Sub / PReLU ops or depthwise convs read (a residual branch, a conv before its PReLU,
    a block's output that the next Add reads; a depthwise conv reads it in two INT8 passes) is
    written on a 16-bit grid by its conv or Add, other readers taking it through a cast to 8 bits,
    the FLOPs staying INT8 (`tftpu.quant.links`); False keeps every
    activation on 8 bits; "tables": a conv that only smooth activation tables read (SiLU,
    HardSwish, GELU, ...) as well, each table interpolating 513 knots from 16 bits; "convs": with
    the tables, every conv reads 16 bits (W8A16, two INT8 passes); a set: the tables, the convs
    it names reading 16 bits and those named by `tftpu.quant.links.WideWeights(name)` multiplying
    16-bit weights (W16A8, two INT8 passes; `deploy`); "auto" (the default): where
    all INT8 misses the target, the dense convs whose 8-bit input adds the most noise per extra
    cycle read 16 bits too, as many as keep the estimated latency within 1.10x of the program
    with 8-bit conv inputs (the float ops' latency budget counts from that program); else links,
    and given a test input the program is built with the tables too, the better kept (`deploy`).
    `float_tail` (INT8): a detector's decode tail (the scores, a DFL
    softmax-expectation and the box arithmetic after its last feature layers:
    `tftpu.transforms.lowering.decode_tail`) runs in float by design, its head convs writing
    16-bit logits into it; False lowers it in INT8 too. `equalize` (INT8): each depthwise conv's
    input (kernels over 7x7; smaller ones read it on a 16-bit link) scaled per channel nearer its
    widest channel, the conv's weights taking the factors back (`tftpu.quant.equalize`); "auto"
    (the default) keeps it where the all-INT8 programs with
    and without it, judged on the test input and samples, say it does better by 1 dB or more.
    `input_grid` (INT8): where the samples' image values lie on 256 evenly spaced levels per
    channel (`(p / 255 - mean_c) / std_c`), the stem conv reads each pixel's level exactly instead
    of through one INT8 grid for all channels (`tftpu.quant.input_grid`; measured: that grid's
    rounding alone held PP-OCRv6's text detector to 20 dB, PP-OCRv4's to 8 dB); False keeps it.
    `cross_layer` (INT8): each conv output that only dense convs read, the conv ending in nothing
    or a plain ReLU, scaled per channel nearer its widest channel on the samples, the readers'
    weights taking the factors back (`tftpu.quant.cross_layer`; the float program checked
    unchanged); off by default: it pays on some ReLU networks, not all (measured: PP-OCRv3's text
    detector 18.6 -> 19.5 dB, PP-OCRv4's 20.8 -> 16.4; the quantization guide has the others), and
    a second build with it where the target is missed did not pay for its time (PP-OCRv3: with
    the table the calibration choice keeps, 17.5 dB against 18.6).
    `reader_ranges` (INT8): a tensor that only saturating functions read (a sigmoid head's
    logits, an SE block's HardSigmoid gate input, a conv before its ReLU6 or SiLU), through data
    moves and constant shifts and scales, has its range clipped to the interval where they still
    change (`tftpu.quant.saturation`: exactly for the hard ones, within 1e-7 of the asymptote for
    sigmoid, tanh, SiLU, GELU), its 8-bit grid spent where the outputs move; False keeps the
    calibrated ranges.
    `log` (a callable taking a line) reports progress; by default the `tftpu.compile` logger."""
    from tftpu.pipelines.deploy import all_int8_reach, carried, choices_of, deploy, rounded_args

    if log is not None and not callable(log):
        raise errors.UsageError(f"log={log!r}: expected a callable taking a line")
    say = log or _LOG.info
    if not isinstance(quantize, str):
        raise errors.UsageError(f"quantize={quantize!r}: expected one of F32, F16, BF16, INT8")
    mode = quantize.upper()
    if tolerance is not None:                       # (checked before the work, not after it)
        from tftpu.interp.similarity import parse_tolerance
        parse_tolerance(tolerance)
    from tftpu import chip as chips
    chips.load(chip)                                # (a bad chip named before the import)
    check_cross_layer(cross_layer)
    check_choices(space_to_depth=space_to_depth, bias_correction=bias_correction, weight_rounding=weight_rounding,
                  weight_refit=weight_refit, float_tail=float_tail, input_grid=input_grid,
                  reader_ranges=reader_ranges)
    check_choices(AUTO, asymmetric=asymmetric, equalize=equalize)
    methods = methods_of(calibration_method)
    t_all = time.perf_counter()
    with span("import"):
        top_model, proto, stage = _import(model, input_shapes)
    stages = [stage]
    extra: dict = {}
    synthetic = calibration_data is None and test_input is None
    stream = None
    if calibration_data is not None:       # streamed: only the check input and deploy's samples are kept
        from tftpu.quant.dataset import iter_samples
        stream = iter_samples(top_model, calibration_data, what="calibration_data")
        samples = stream.head(1 + REFIT_SAMPLES)      # (the check input, when not given, and the refit's)
    elif test_input is not None:
        samples = _samples(top_model, test_input, "test_input")
    else:
        samples = _synthetic(top_model)
        extra["warning"] = ("no calibration_data: calibrated and checked on synthetic inputs (uniform in [-1, 1]); "
                            "pass real samples for real accuracy")
        say(f"warning: {extra['warning']}")
    check = _samples(top_model, test_input, "test_input")[0] if test_input is not None else samples[0]
    if proto is not None:
        _check_import(stage, proto, top_model, check)
    say(f"[1] {stage}")
    table = None
    if mode == "INT8":
        from tftpu import quant
        t0 = time.perf_counter()
        with span("calibrate", methods=",".join(methods)):
            tables = quant.calibrate_each(top_model, samples if stream is None else stream, methods,
                                          asymmetric=bool(asymmetric))
        table = tables[methods[0]]
        what = (f"{', '.join(methods)} over {table.samples} {'synthetic ' if synthetic else ''}samples, "
                f"{len(table.entries)} tensors")
        stages.append(Stage("calibrate", time.perf_counter() - t0, what))
        say(f"[2] {stages[-1]}")
    shown = len(stages)                     # the stages said so far

    others = [s for s in samples if s is not check]       # what the search judges and the refit fits on

    equalized: dict = {}                   # method -> whether its build equalized the depthwise inputs

    prepared: dict = {}                    # method -> its own build's (model, table, steps)

    def prepare(method, table, like=None) -> tuple:
        """(TOP model, table, the equalization steps' (report key, stage)) a build with `table`
        starts from (an own build's once per table: a table judged all in INT8 is built so after)."""
        if like is None and method in prepared:
            return prepared[method]
        model, steps = top_model, []
        if mode == "INT8" and equalize and (like is None or equalized[like[1]]):
            model, table, stage = _equalize(model, table, samples[:1 + JUDGE_SAMPLES], check, chip,
                                            asymmetric, method, equalize if like is None else True)
            steps.append(("equalize", stage))
        if mode == "INT8" and cross_layer and others:      # (the samples and check deploy judges on)
            model, table, stage = _cross_layer(model, table, others[:JUDGE_SAMPLES], check, asymmetric, method)
            steps.append(("cross_layer", stage))
        if like is None:
            prepared[method] = model, table, steps
        return model, table, steps

    def deploy_args(table, like=None) -> dict:
        args = dict(quantize_table=quantize_table, mixed_precision=mixed_precision, bias_correction=bias_correction,
                    weight_rounding=weight_rounding, weight_refit=weight_refit, refit_rounding=refit_rounding,
                    wide_links=wide_links)
        if like is not None:                               # (compile equalizes before deploy)
            args.update({k: v for k, v in choices_of(like[0][-1]).items() if k != "equalize"})
        return dict(quantize=mode, chip=chip, calibration_table=table, asymmetric=asymmetric,
                    test_input=check, tolerance=tolerance, samples=others[:JUDGE_SAMPLES],
                    fit_samples=others[:REFIT_SAMPLES], space_to_depth=space_to_depth,
                    mixed_precision_budget=mixed_precision_budget, mixed_precision_latency=mixed_precision_latency,
                    float_tail=float_tail, input_grid=input_grid, reader_ranges=reader_ranges, checks=False, **args)

    def build(method, table, like=None, give_up=None, rounded=None):
        """(TOP model, table, the equalization steps' (report key, stage), DeployResult) for one
        calibration table; `like` (another table's build, and its method): with the choices it
        made, not searched again (`tftpu.pipelines.deploy.choices_of`); `give_up`: deploy's;
        `rounded`: the GPTQ rounding its all-INT8 program met the target with (`probe`'s)."""
        model, table, steps = prepare(method, table, like)
        equalized[method] = model is not top_model
        with span("program", table=method or "", choices="carried" if like is not None else "own"):
            given = rounded_args(rounded) if rounded is not None else {}
            done = deploy(model, **{**deploy_args(table, like), **given}, _give_up=give_up)
        if like is not None:
            done = carried(done, like[0][-1], like[1])
        return model, table, [(k, st) for k, st in steps if st is not None], done

    def probe(method, table):
        """What the all-INT8 program a build with `table` starts from reaches (`Reach`), and near
        the target, with 16-bit dense conv inputs and GPTQ-rounded weights."""
        model, table, _ = prepare(method, table)
        with span("all INT8", table=method or ""):
            return all_int8_reach(model, rounded=True, **deploy_args(table))

    if mode == "INT8" and len(methods) > 1:
        tried = try_tables(tables, build, target_of(mixed_precision), say,
                           like=lambda method, table, first, was: build(method, table, (first, was)),
                           probe=probe)
        top_model, table, steps, deployed = tried.built
        extra["calibration"] = tried.as_dict()
        if len(tried.figures) > 1 or tried.gave_up is not None:   # (only where the first table missed the target)
            stages.insert(shown, Stage("calibration choice", tried.others_seconds, tried.line))
            say(f"[{shown + 1}] {stages[shown]}")
            shown += 1
    else:
        top_model, table, steps, deployed = build(methods[0] if mode == "INT8" else None, table)
    deployed.run_checks()                      # (the programs weighed and not kept are not checked)
    for key, stage in steps:
        stages.insert(shown, stage)
        extra[key] = stage.check
        say(f"[{shown + 1}] {stage}")
        shown += 1
    secs = deployed.seconds
    if deployed.weight_rounding is not None:
        stages.append(Stage("weight rounding", secs.get("weight rounding", 0.0), str(deployed.weight_rounding)))
        extra["weight_rounding"] = deployed.weight_rounding.as_dict()
    if deployed.bias_correction is not None:
        what = "weight refit" if deployed.bias_correction.refit else "bias correction"
        stages.append(Stage(what, secs.get(what, 0.0), str(deployed.bias_correction)))
        extra[what.replace(" ", "_")] = deployed.bias_correction.as_dict()
    s2d = deployed.s2d or {}
    if space_to_depth:
        state = ("applied: " if s2d.get("applied") else "declined: ") + s2d.get("reason", "no strided stem on the image")
        passed = None
        if "max_rel_diff" in s2d:
            state += f"; rewritten TOP vs TOP: max relative difference {s2d['max_rel_diff']:.1e}"
            passed = s2d["max_rel_diff"] <= 1e-4
        stages.append(Stage("space-to-depth", secs.get("space-to-depth", 0.0), state, passed))
    if deployed.input_grid is not None:
        stages.append(Stage("input grid", secs.get("input grid", 0.0), deployed.input_grid))
        extra["input_grid"] = deployed.input_grid
    if deployed.reader_ranges is not None:
        stages.append(Stage("reader ranges", secs.get("reader ranges", 0.0), deployed.reader_ranges))
        extra["reader_ranges"] = deployed.reader_ranges
    out_rows = deployed.rows
    worst = min(out_rows, key=lambda r: (r.passed, r.cosine, r.sqnr)) if out_rows else None
    lowering = ", ".join(f"{n} {m}" for m, n in sorted(deployed.lowering.counts().items()))
    shares = deployed.lowering.flop_shares()
    if len(shares) > 1:
        lowering += "; FLOPs " + ", ".join(f"{v:.1%} {m}" for m, v in shares.items())
    # (the float and tables checks' builds count in "lower" and the refit's own stage already)
    searched = sum(secs.get(k, 0.0) for k in ("lower", "mixed precision search", "conv links", "keep check", "verify"))
    stages.append(Stage("lower", searched,
                        f"TPU ({lowering}) vs TOP: worst output cosine {worst.cosine:.6f}, SQNR {worst.sqnr:.1f} dB"
                        + (f" ({worst.note})" if worst.note else "") if worst else f"TPU ({lowering})", all(r.passed for r in out_rows) if out_rows else None))
    prog = deployed.program
    stages.append(Stage("codegen", secs.get("layer groups + memory + codegen", 0.0),
                        f"{len(prog.groups.local_groups)} layer groups, {len(prog.commands):,} commands, DDR "
                        f"{deployed.memory.peak:,} B activations (lower bound {deployed.memory.lower_bound:,} B)"))
    sim = deployed.simulator
    if sim is not None:
        exact = all(r["bit_exact"] for r in sim["outputs"])
        stages.append(Stage("simulate", secs.get("simulate", 0.0),
                            "simulator vs TPU inference: " + ("bit-exact" if exact else "max difference "
                                                              + format(max(r["max_abs_diff"] for r in sim["outputs"]), ".3g")),
                            sim["passed"]))
    for s in stages[shown:]:
        say(f"[{stages.index(s) + 1}] {s}")
    search = deployed.search
    if search is not None and (search.kept or not search.met):
        say(f"    mixed precision: {search.summary}")
        for note in search.notes:
            say(f"    ({note})")
    elif deployed.tables:                   # (the search's notes hold it too)
        say(f"    ({deployed.tables})")
    if deployed.conv_links:
        say(f"    ({deployed.conv_links})")
        extra["conv_links"] = deployed.conv_links
    if deployed.weights_line:
        say(f"    ({deployed.weights_line})")
    if deployed.range_line:
        say(f"    ({deployed.range_line})")
    if s2d.get("applied"):              # the same precision choices, without the rewrite
        names = {op.loc for op in top_model.ops}
        qtable = deployed.search.qtable if deployed.search is not None else quantize_table
        if isinstance(qtable, dict):
            qtable = {k: v for k, v in qtable.items() if k in names}
        plain = deploy(top_model, quantize=mode, chip=chip, calibration_table=table, asymmetric=asymmetric,
                       quantize_table=qtable, mixed_precision=None, wide_links=deployed.wide_links,
                       float_tail=float_tail)
        extra["latency_us_without_s2d"] = round(plain.profile.latency_us, 3)
    extra["seconds"] = round(time.perf_counter() - t_all, 3)
    compiled = CompiledModel(deployed, top_model, stages, extra)
    if not compiled.passed:
        say("warning: " + "; ".join(str(s) for s in stages if s.passed is False))
    return compiled
