"""tftpu-deploy: lower a TOP model to the TPU dialect for a chip and mode, compile it to a model
file, and check each stage against the one before.

    tftpu-deploy --mlir=resnet.top.mlir --quantize=INT8 --chip=npu1 \\
        --calibration_table=resnet_cali_table --test_input=in.npz --tpu_mlir=resnet.tpu.mlir \\
        --model=resnet.tpumodel --report=deploy.html --trace=resnet.trace.json

Writes the TPU module (.tpu.mlir + its weights .npz) and the compiled program (.tpumodel: layer
groups, DDR plan, command list) with its estimated timeline (--trace, for Perfetto). With a test
input the simulator runs the program and must equal TPU inference (INT8 bit for bit), and
every tensor the TPU model shares with TOP is compared (INT8 tensors dequantized) and the outputs are judged against
--tolerance (default per mode, as TPU-MLIR: F32 0.99,0.99; F16 0.95,0.85; BF16 0.95,0.80;
INT8 0.8,0.5); an output made by a Concat is also judged part by part. Exit status 1 when a
check falls short. --quantize_table pins ops to modes (`op_name MODE` per line). In INT8 with a
test input, ops are kept in float only where pure INT8 misses cosine 0.99 / SQNR 20 dB: the
fewest that reach it, found by a sensitivity search (--mixed_precision), within 5% of the FLOPs
and 1.15x the all-INT8 latency unless told otherwise (--mixed_precision_budget, _latency).
"""

from absl import flags

from tftpu import cli
from tftpu.quant.links import WideWeights
from tftpu.quant.refit import MAX_SAMPLES as REFIT_SAMPLES
from tftpu.transforms.lowering.search import FLOAT_BUDGET, JUDGE_SAMPLES, LATENCY_BUDGET

flags.DEFINE_string("mlir", None, "TOP .mlir to deploy")
cli.define_mode("quantize", "F32", ["F32", "BF16", "F16", "INT8"], "arithmetic of the TPU model")
flags.DEFINE_string("chip", None, "chip name (tftpu/configs/chips/NAME.yaml, e.g. npu1, edge16) or a YAML path")
flags.DEFINE_string("calibration_table", None, "calibration table from tftpu-calibrate (needed for INT8)")
flags.DEFINE_string("quantize_table", None, "per-op mode overrides: one 'op_name MODE' per line")
flags.DEFINE_bool("asymmetric", None, "INT8 with zero points on every activation (over its calibrated min..max); "
                  "--noasymmetric on none; by default on the activations whose range is one-sided (ReLU, sigmoid, "
                  "SiLU outputs) where the calibration table holds asymmetric ranges (tftpu-calibrate's default)")
flags.DEFINE_string("test_input", None, ".npz input to verify with (keys: input names, or in input order)")
flags.DEFINE_string("samples", None, "INT8: inputs besides --test_input that the weight refit, bias correction and "
                    "mixed-precision search fit and judge on, as tftpu.compile does with its calibration data: a "
                    "directory, a glob (quoted) or a TFRecord file of .npz/.npy inputs or images (as --mean, --scale "
                    f"and --pixel_format say); the first {REFIT_SAMPLES} (the refit fits on them, the rest on "
                    f"the first {JUDGE_SAMPLES})")
cli.define_image_flags()
flags.DEFINE_string("test_reference", None, ".npz of reference outputs (default: TOP's own outputs)")
flags.DEFINE_string("tolerance", None, "minimum cosine,euclidean similarity of the outputs (default per mode)")
flags.DEFINE_string("mixed_precision", "auto", "INT8 with --test_input: 'auto' keeps pure INT8 where the outputs "
                    "reach cosine 0.99 and SQNR 20 dB, else the fewest ops in float (F16 where the chip has "
                    "it) that reach it; 'COS,SQNR_DB' another target; 'none' pure INT8")
flags.DEFINE_enum("mixed_precision_ranking", "auto", ["auto", "isolated", "gain", "effect", "alone"],
                  "how the search picks ops for float: 'auto' ('gain' where that costs at most "
                  "tftpu.transforms.lowering.search.GAIN_WORK FLOPs, and then 'isolated' as well, keeping "
                  "the float set that does better on the weights lowered; else 'isolated'), 'isolated' (each op's own error on exact inputs "
                  "per share of the FLOPs; one inference in all), 'gain' (the same, by what keeping each op in "
                  "float removes, carried through the float model to the outputs; a pass over the ops "
                  "after each op), 'effect' (where the error appears on "
                  "the way to the outputs that miss, a few ops a round; slower) or 'alone' (the outputs "
                  "with only that op in INT8, TPU-MLIR's measure; one inference per op); each then tries "
                  "the float ops holding the most FLOPs back in INT8")
flags.DEFINE_float("mixed_precision_budget", FLOAT_BUDGET, "the most of the model's FLOPs the search may keep in "
                   "float (a share: 0.05, the default, keeps 95% of the FLOPs in INT8; 1 lifts the limit): where "
                   "the target needs more, the search keeps what fits and reports the target missed",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_float("mixed_precision_latency", LATENCY_BUDGET, "the most the float ops may slow the program, as a "
                   "multiple of its estimated latency all in INT8 (default 1.15; inf lifts the limit): where the "
                   "target needs more, the search keeps what fits and reports the target missed", lower_bound=1.0)
flags.DEFINE_bool("space_to_depth", False, "rewrite the first strided conv on the image to its space-to-depth "
                  "form first, where the chip's matrix unit gains (the image is rearranged in the module)")
flags.DEFINE_bool("bias_correction", None, "INT8: lower a copy whose conv/matmul/deconv biases absorb the mean "
                  "per-channel INT8 error measured on --test_input, kept only where its outputs get no further "
                  "from TOP; every check still compares against the TOP model given (on by default with --samples)")
flags.DEFINE_bool("weight_rounding", None, "INT8: round the INT8 conv/matmul weights by per-layer reconstruction "
                  "on --test_input (each rounding error taken back by the weights not rounded yet, through "
                  "the layer's input statistics: GPTQ) instead of to nearest, before the mixed-precision "
                  "search; kept only where the outputs get no further from TOP (on by default with --samples)")
flags.DEFINE_bool("weight_refit", None, "INT8 (instead of --weight_rounding): refit each 2-D conv's weights and "
                  "bias to the simulated INT8 inputs it gets on --test_input with the float ops chosen (ridge least "
                  "squares towards the float weights: AdaQuant's layer-wise fit in closed form), the other "
                  "biases corrected as --bias_correction does; kept only where the outputs get no further from TOP "
                  "(on by default with --samples: fitted to --test_input alone, it would be judged on what it "
                  "was fitted to)")
flags.DEFINE_enum("refit_rounding", "auto", ["auto", "nearest", "gptq"], "INT8, with --weight_refit: how the "
                  "refit weights reach their INT8 grid: nearest, gptq (each conv's rounding errors fed back through "
                  "its INT8 inputs' covariance, the bias taking back their mean) or auto (both built, the better "
                  "on --test_input and --samples kept)")
flags.DEFINE_bool("input_grid", None, "INT8: where the samples' image values lie on 256 evenly spaced levels per "
                  "channel (pixels normalized per channel: (p / 255 - mean) / std), the stem conv reads those "
                  "levels exactly (computed in float, cast to INT8 without rounding; the conv takes the step and "
                  "origin into its weights and bias) instead of through one INT8 grid for all channels (on by "
                  "default with --samples: the levels are found in them and the test input)")
flags.DEFINE_bool("wide_links", True, "INT8: a tensor that INT8 Add/Sub/PReLU ops read (a residual branch, "
                  "a conv before its PReLU, a block's output) is written on a 16-bit grid by its conv or Add "
                  "(other readers take it through a cast to 8 bits), the FLOPs staying INT8; --nowide_links "
                  "keeps every activation on 8 bits")
flags.DEFINE_enum("wide_tables", "auto", ["auto", "on", "off"],
                  "INT8, with --wide_links: 'on': a conv that only smooth activation tables read (SiLU, "
                  "HardSwish, GELU, ...) writes 16 bits too, each table interpolating 513 knots (a fused conv + "
                  "activation); 'auto': with --test_input, the program is built both ways and the better kept")
flags.DEFINE_list("wide_weights", None, "INT8: these convs (by name) multiply 16-bit weights, in two INT8 passes "
                  "over their high and low byte, instead of INT8 weights (where a conv's weight rounding costs "
                  "the outputs most: an early conv of a detector whose score maps are near constant); the other "
                  "links as --wide_tables=on, no conv links priced")
flags.DEFINE_bool("conv_links", True, "INT8, with --wide_links, --wide_tables=auto and --test_input or --samples: "
                  "where all INT8 misses the target, dense convs read their input on 16 bits too (two INT8 passes "
                  "over its high and low byte), those whose 8-bit input adds the most noise per extra cycle first, "
                  "as many as keep the estimated latency within 1.10x of the program with 8-bit conv inputs (where "
                  "all INT8 is kept and still misses, a build with the whole --mixed_precision_latency is tried "
                  "too, the better kept); "
                  "--noconv_links keeps dense convs' inputs on 8 bits")
flags.DEFINE_bool("float_tail", True, "INT8: a detector's decode tail (its scores, a DFL softmax-expectation and "
                  "box arithmetic after the last feature layers) runs in float by design, the head convs "
                  "writing 16-bit logits into it; --nofloat_tail lowers it in INT8 too")
flags.DEFINE_enum("equalize", "auto", ["auto", "on", "off"],
                  "INT8, with --samples: scale each depthwise conv's input (kernels over 7x7; smaller ones read it "
                  "on a 16-bit link) per channel nearer its widest channel "
                  "(the conv's weights take the factors back; the float program unchanged), as tftpu.compile does; "
                  "'auto' keeps it where the all-INT8 programs judge it 1 dB better")
flags.DEFINE_bool("cross_layer", False,
                  "INT8, with --samples: scale each conv output that only dense convs read (the conv ending in "
                  "nothing or a plain ReLU) per channel nearer its widest channel, the readers' weights taking the "
                  "factors back (the float program unchanged), as tftpu.compile(cross_layer=True) does")
flags.DEFINE_bool("reader_ranges", True,
                  "INT8: clip the range of each tensor that only saturating functions read (a sigmoid head's "
                  "logits, an SE gate's HardSigmoid input, a conv before its ReLU6 or SiLU) to where they still "
                  "change, as tftpu.compile does")
flags.DEFINE_string("tpu_mlir", None, "output TPU module (.tpu.mlir; its weights .npz go beside it)")
flags.DEFINE_string("report", None, "report file: .json for data, .html (any other suffix) for a page")
flags.DEFINE_string("model", None, "output model file (.tpumodel): the compiled program for the simulator "
                    "(tftpu-run --model=X.tpumodel)")
flags.DEFINE_string("trace", None, "output timeline of the program (Chrome trace-event JSON; open in Perfetto)")

FLAGS = flags.FLAGS


def _model_and_samples():
    """The model to deploy (loaded once where --samples needs it, else its path) and the first
    `REFIT_SAMPLES` inputs --samples names (None without it)."""
    if not FLAGS.samples:
        return FLAGS.mlir, None
    from tftpu.ir.module import TpuModel, load
    from tftpu.quant.dataset import iter_samples

    model = load(FLAGS.mlir)
    if isinstance(model, TpuModel):             # deploy refuses it, naming the file
        return FLAGS.mlir, None
    found = list(iter_samples(model, FLAGS.samples, REFIT_SAMPLES, cli.floats(FLAGS.mean, "mean"),
                              cli.floats(FLAGS.scale, "scale"), FLAGS.pixel_format, what="--samples"))
    return model, found or None


def main(args):
    from tftpu import errors
    from tftpu.pipelines.deploy import deploy

    for flag in ("mlir", "chip"):
        if not getattr(FLAGS, flag):
            raise errors.UsageError(f"--{flag} is required")
    if not (FLAGS.tpu_mlir or FLAGS.test_input or FLAGS.report or FLAGS.model or FLAGS.trace):
        raise errors.UsageError("nothing to do: give --model, --tpu_mlir, --test_input, --report or --trace")
    model, samples = _model_and_samples()
    fitting = {name: samples is not None if getattr(FLAGS, name) is None else getattr(FLAGS, name)
               for name in ("bias_correction", "weight_rounding", "weight_refit")}
    result = deploy(model, quantize=FLAGS.quantize, chip=FLAGS.chip,
                    calibration_table=FLAGS.calibration_table, quantize_table=FLAGS.quantize_table,
                    asymmetric=FLAGS.asymmetric, test_input=FLAGS.test_input, test_reference=FLAGS.test_reference,
                    tolerance=FLAGS.tolerance, tpu_mlir=FLAGS.tpu_mlir, report=FLAGS.report,
                    mixed_precision=FLAGS.mixed_precision, mixed_precision_ranking=FLAGS.mixed_precision_ranking,
                    mixed_precision_budget=FLAGS.mixed_precision_budget,
                    mixed_precision_latency=FLAGS.mixed_precision_latency,
                    space_to_depth=FLAGS.space_to_depth, model=FLAGS.model, trace=FLAGS.trace,
                    samples=samples and samples[:JUDGE_SAMPLES], fit_samples=samples,
                    float_tail=FLAGS.float_tail, **fitting, refit_rounding=FLAGS.refit_rounding,
                    equalize={"auto": "auto", "on": True, "off": False}[FLAGS.equalize],
                    cross_layer=FLAGS.cross_layer, reader_ranges=FLAGS.reader_ranges,
                    wide_links=(frozenset(WideWeights(n) for n in FLAGS.wide_weights) if FLAGS.wide_weights else
                                FLAGS.wide_links and {"auto": "auto", "on": "tables", "off": True}[FLAGS.wide_tables]),
                    conv_links=FLAGS.conv_links,
                    input_grid=samples is not None if FLAGS.input_grid is None else FLAGS.input_grid)
    if result.calibration is not None:
        print(f"calibration: {result.calibration.line}")
    if result.cross_layer:
        print(f"cross-layer equalization: {result.cross_layer}")
    if result.equalize:
        print(f"equalize: {result.equalize}")
    if result.input_grid:
        print(f"input grid: {result.input_grid}")
    if result.reader_ranges:
        print(f"reader ranges: {result.reader_ranges}")
    print(result.lowering)
    if result.search is not None:
        print(result.search)
    if result.conv_links:
        print(f"wide links: {result.conv_links}")
    if result.tables and result.search is None:      # (str(search) holds it too)
        print(f"wide links: {result.tables}")
    if result.weights_line:
        print(f"weights: {result.weights_line}")
    if result.range_line:
        print(f"ranges: {result.range_line}")
    if result.weight_rounding is not None:
        print(f"weight rounding: {result.weight_rounding}")
    if result.bias_correction is not None:
        print(f"{'weight refit' if result.bias_correction.refit else 'bias correction'}: {result.bias_correction}")
    if result.memory is not None:
        print(result.memory)
    if result.program is not None:
        print(result.program.groups)
        plan = result.program.host_plan
        if plan is not None and plan.ops:
            print(f"host runs {len(plan.ops)} op(s) (TAC's pick: {plan.cost_us:,.1f} us against "
                  f"{plan.all_chip_us:,.1f} us all on chip): "
                  + "; ".join(f"{n}: {why}" for n, why in list(plan.reasons.items())[:5]))
    if result.profile is not None:
        print(result.profile)
    elif result.cycles is not None:
        print(result.cycles)
    stem = result.s2d
    if stem and stem.get("applied"):
        print(f"space-to-depth applied to {stem['name']}: {stem['reason']}"
              + (f"; {stem['after']:,} cycles instead of {stem['before']:,}" if stem.get("before") else ""))
    elif stem and "reason" in stem:
        print(f"space-to-depth declined: {stem['reason']}")
    elif stem:
        before, after = stem["before"], stem["after"]
        print(f"space-to-depth of the first conv ({stem['name']}) would take {after:,} cycles instead of "
              f"{before:,} ({before / max(after, 1):.2f}x fewer; --space_to_depth applies it)")
    if result.checked:
        cos, euc = result.tolerance
        print(f"outputs against {result.reference} (tolerance cosine {cos}, euclidean {euc}):")
        for r in result.outputs:
            print(f"  {r.name}: cosine {r.cosine:.6f}, euclidean {r.euclid:.6f}, SQNR {r.sqnr:.1f} dB"
                  f"{'' if r.passed else '  << under tolerance'}")
        for out, rows in result.parts:
            for r in rows:
                print(f"  part {r.name}: cosine {r.cosine:.6f}, SQNR {r.sqnr:.1f} dB{'' if r.passed else '  << under tolerance'}")
        worst = result.worst_tensors(3)
        if worst:
            print("worst tensors: " + ", ".join(f"{r.name} (cosine {r.cosine:.4f}, SQNR {r.sqnr:.1f} dB)" for r in worst))
    if result.simulator is not None:
        sim = result.simulator
        exact = all(r["bit_exact"] for r in sim["outputs"])
        print(f"simulator against TPU inference: {'bit-exact' if exact else 'max difference ' + format(max(r['max_abs_diff'] for r in sim['outputs']), '.3g')}"
              f"{'' if sim['passed'] else '  << FAILED'} ({sim['seconds']} s)")
    for path in (result.mlir, result.weights, result.model_file, result.trace):
        if path is not None:
            print(f"wrote {path}")
    if FLAGS.report:
        print(f"wrote {FLAGS.report}")
    if result.checked and not result.passed:
        names = ", ".join(r.name for r in result.failed)
        raise errors.ToleranceError(f"TPU model under tolerance {result.tolerance[0]},{result.tolerance[1]}: {names}")
    return 0


def _paths(args):
    """--tpu_mlir (with the weights .npz it writes beside it), --model, --report and --trace, against
    each other and the inputs (the TOP module's weights included)."""
    from pathlib import Path

    from tftpu.ir.module import default_weight_file
    from tftpu.utils import output_paths

    name = output_paths.mlir_name(FLAGS.mlir)
    weights = (Path(FLAGS.tpu_mlir).parent / default_weight_file(name, f"tpu_{FLAGS.quantize.lower()}")
               if FLAGS.tpu_mlir and name else None)
    chip = FLAGS.chip if FLAGS.chip and FLAGS.chip.endswith((".yaml", ".yml")) else None
    output_paths.check(
        [("--tpu_mlir", FLAGS.tpu_mlir), ("--tpu_mlir's weights", weights), ("--model", FLAGS.model),
         ("--report", FLAGS.report), ("--trace", FLAGS.trace)],
        [("--mlir", FLAGS.mlir), ("--mlir's weights", output_paths.mlir_weights(FLAGS.mlir)),
         ("--calibration_table", FLAGS.calibration_table), ("--quantize_table", FLAGS.quantize_table),
         ("--test_input", FLAGS.test_input), ("--test_reference", FLAGS.test_reference),
         ("--samples", FLAGS.samples), ("--chip", chip)])


def run():
    cli.run(main, __doc__, tensorflow=True, paths=_paths)


if __name__ == "__main__":
    run()
