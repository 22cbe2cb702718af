"""Shared plumbing of the command-line tools in tools/.

`run(main, doc)` parses absl flags and runs `main`, turning every failure a user can cause into
one line on stderr and the documented exit status: 0 success, 1 a check failed, 2 bad input
or usage (an unknown or malformed flag included), 70 an internal error (a bug, naming the pass or op),
130 / 143 interrupted by SIGINT / SIGTERM (temporary files removed). `--help` prints the tool's
flags and exits 0. Tools are quiet: TensorFlow's start-up lines, its logs and other packages'
warnings are kept off stderr (`tftpu.utils.quiet`) unless `TFTPU_VERBOSE=1`.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, Sequence

from absl import flags, logging

from tftpu import errors
from tftpu.utils import quiet

FLAGS = flags.FLAGS
_HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull", "-?")


def _prog(argv: Sequence[str]) -> str:
    return os.path.basename(argv[0]) if argv else "tftpu"


def fail(prog: str, message: str, code: int) -> int:
    """Print `prog: error: message` as one line on stderr and return `code`."""
    line = " ".join(str(message).split())
    print(f"{prog}: error: {line}", file=sys.stderr)
    return code


def _usage(prog: str, doc: str) -> str:
    import re

    modules = [m for m in FLAGS.flags_by_module_dict() if not m.startswith("absl")]
    flag_help = "\n".join(FLAGS.module_help(m).strip().split("\n", 1)[-1] for m in modules)
    # a one-letter flag is spelt as the examples spell it: -o, not --o
    flag_help = re.sub(r"^(\s*)--(\[no\])?(\w):", r"\1-\2\3:", flag_help, flags=re.M)
    return f"{doc.strip()}\n\nusage: {prog} [flags]\n\nflags:\n{flag_help}\n"


def parse(argv: Sequence[str], doc: str, positional: bool = False) -> list[str]:
    """Parse flags; raise UsageError on a bad flag; print help and exit 0 on --help."""
    prog = _prog(argv)
    if any(a in _HELP or a.split("=")[0] in _HELP for a in argv[1:]):
        sys.stdout.write(_usage(prog, doc))
        sys.exit(0)
    try:
        rest = FLAGS(list(argv))
    except flags.Error as e:
        raise errors.UsageError(str(e)) from None
    if len(rest) > 1 and not positional:
        raise errors.UsageError(f"unexpected argument(s): {' '.join(rest[1:])}")
    return rest


def run(main: Callable[[list[str]], int | None], doc: str,
        argv: Sequence[str] | None = None, positional: bool = False, tensorflow: bool = False,
        paths: Callable[[list[str]], None] | None = None) -> None:
    """Run a tool's `main(args)` and exit with its status.

    `tensorflow=True` imports TensorFlow (quietly) once the flags are good, for tools that use it.
    `paths(args)`, given for every tool that writes files, checks the tool's outputs against its
    inputs and each other (`tftpu.utils.output_paths.check`) once the flags parse, before
    TensorFlow is imported or any work starts, so a run that would clobber an input or could not
    write all its outputs fails at once with nothing written.
    """
    argv = list(sys.argv if argv is None else argv)
    prog = _prog(argv)
    signal.signal(signal.SIGTERM, _terminate)
    with quiet.tool_output(prog):   # stderr is the tool's own lines only, unless TFTPU_VERBOSE=1
        try:
            args = parse(argv, doc, positional)
            logging.use_absl_handler()
            logging.set_verbosity(logging.INFO if quiet.verbose() else logging.WARNING)
            if paths is not None:
                paths(args)
            if tensorflow:
                quiet.import_tensorflow()
            code = main(args)
        except errors.TftpuError as e:
            code = fail(prog, e, e.exit_code)
        except errors.InternalError as e:
            code = fail(prog, f"internal error (a bug in tftpu, please report it): {e}", e.exit_code)
        except KeyboardInterrupt:
            code = fail(prog, "interrupted", 130)
        except errors.Terminated:
            code = fail(prog, "terminated", 143)
    sys.exit(code or 0)


def _terminate(signum, frame):
    """SIGTERM unwinds like Ctrl-C, so temporary files and directories are removed."""
    raise errors.Terminated()


def floats(values: Sequence[str], flag: str) -> list[float]:
    """A list flag's values as finite numbers; a UsageError naming the flag otherwise."""
    import math

    try:
        numbers = [float(v) for v in values]
    except ValueError:
        raise errors.UsageError(f"--{flag}={','.join(values)}: expected numbers") from None
    if not all(math.isfinite(v) for v in numbers):
        raise errors.UsageError(f"--{flag}={','.join(values)}: expected finite numbers")
    return numbers


def define_mode(name: str, default, values: Sequence[str], help: str) -> None:
    """An enum flag whose values are taken in any case (`--quantize=int8` or `INT8`), held as
    written in `values`: the modes are spelled one way in Python and another in TFLite's CLI."""
    flags.DEFINE(flags.EnumParser(list(values), case_sensitive=False), name, default,
                 f"{help} (one of {', '.join(values)}; any case)", serializer=flags.ArgumentSerializer())


def require(*names: str) -> None:
    """A UsageError naming the first of the flags `names` that was not given."""
    for name in names:
        if not getattr(FLAGS, name):
            raise errors.UsageError(f"{'-' if len(name) == 1 else '--'}{name} is required")


def define_dataset_flags(input_num: int, what: str) -> None:
    """The flags of a tool that reads a dataset (tftpu-calibrate, tftpu-evaluate), defined once:
    --dataset, --input_num (0: all), --mean, --scale, --pixel_format, --skip_unreadable, --progress,
    --workers, --tf_config (`cluster()`)."""
    flags.DEFINE_string("dataset", None, "a directory, a glob (quoted: 'val/*.jpg') or a TFRecord file of images or "
                        ".npz/.npy inputs, read lazily")
    flags.DEFINE_integer("input_num", input_num, f"number of {what} inputs (the first, by file name); 0 for all",
                         lower_bound=0)
    define_image_flags()
    flags.DEFINE_bool("skip_unreadable", False, "skip (with a warning) files that cannot be read, instead of "
                      "stopping at the first")
    flags.DEFINE_bool("progress", None, "a progress bar (images/s, time left) on stderr; by default only when "
                      "stderr is a terminal")
    flags.DEFINE_integer("workers", 1, "worker processes to start on this machine (tf.distribute "
                         "MultiWorkerMirroredStrategy on loopback), each running every N-th input; 1: this process",
                         lower_bound=1)
    flags.DEFINE_bool("tf_config", False, "run as one worker of the tf.distribute cluster the TF_CONFIG environment "
                      "variable describes (the same command on every machine); the chief, worker 0, writes the outputs")


def define_image_flags() -> None:
    """How images become inputs (--mean, --scale, --pixel_format), for every tool that reads them."""
    flags.DEFINE_list("mean", ["0"], "per-channel mean subtracted from image pixels (one value or one per channel)")
    flags.DEFINE_list("scale", ["1"], "per-channel scale applied after the mean (one value or one per channel)")
    flags.DEFINE_enum("pixel_format", "rgb", ["rgb", "bgr", "gray"], "channel order images are fed in")


def cluster():
    """The tf.distribute cluster `--tf_config` joins (before TensorFlow runs any op), or None."""
    if not FLAGS.tf_config:
        return None
    if FLAGS.workers > 1:
        raise errors.UsageError("--workers starts local workers, --tf_config joins TF_CONFIG's cluster: not both")
    from tftpu.utils.distributed import Cluster
    return Cluster.from_tf_config()


def dataset_tool(*required: str):
    """A dataset tool's flags checked before any file is read (the `required` ones given, the
    dataset numbers finite: a UsageError naming the flag); its cluster (`cluster()`)."""
    require(*required)
    floats(FLAGS.mean, "mean")
    floats(FLAGS.scale, "scale")
    return cluster()


def dataset_samples(model):
    """The lazy sample stream (`tftpu.quant.iter_samples`) the dataset flags describe."""
    from tftpu.quant.dataset import iter_samples
    from tftpu.utils import progress

    require("dataset")
    progress.show(FLAGS.progress)
    return iter_samples(model, FLAGS.dataset, FLAGS.input_num or None, floats(FLAGS.mean, "mean"),
                        floats(FLAGS.scale, "scale"), FLAGS.pixel_format, FLAGS.skip_unreadable, what=FLAGS.dataset)


def skipped_note(samples) -> str:
    """" (N unreadable skipped: a, b, c, ...)" for a stream that skipped files, else ""."""
    skipped = getattr(samples, "skipped", [])
    if not skipped:
        return ""
    more = ", ..." if len(skipped) > 3 else ""
    return f" ({len(skipped)} unreadable skipped: {', '.join(skipped[:3])}{more})"
