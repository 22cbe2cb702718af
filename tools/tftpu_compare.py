"""tftpu-compare: similarity of two .npz files, tensor by tensor.

    tftpu-compare a.npz b.npz --tolerance=0.99,0.99 [--noise_floor=0]

Prints cosine, euclidean similarity and SQNR for every tensor both files hold (`a.npz` is the
reference) and names the tensors only one file holds. A float tensor whose reference and
difference both stay under the rounding-noise floor (64 float32 epsilons of the largest value
in `a.npz`, or `--noise_floor`) passes with the note "rounding noise". Exit status: 0 all pass, 1 a tensor is
under tolerance, 2 a missing or unreadable file or a bad flag.
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("tolerance", "0.99,0.99", "minimum cosine,euclidean similarity")
flags.DEFINE_float("noise_floor", None, "absolute rounding-noise floor (default: 64 float32 epsilons "
                   "of the largest reference value; 0 turns it off)", lower_bound=0.0)

FLAGS = flags.FLAGS


def main(args):
    from tftpu import errors
    from tftpu.interp import similarity

    if len(args) != 3:
        raise errors.UsageError("expected two .npz files: tftpu-compare a.npz b.npz")
    tolerance = similarity.parse_tolerance(FLAGS.tolerance)
    a, b = similarity.load_npz(args[1]), similarity.load_npz(args[2])
    result = similarity.compare_tensors(a, b, tolerance, FLAGS.noise_floor)
    if not result.rows:
        raise errors.UsageError(f"{args[1]} and {args[2]} share no tensor names")
    print(similarity.format_table(result, (args[1], args[2])), end="")
    if not result.passed:
        names = ", ".join(r.name for r in result.failed)
        raise errors.ToleranceError(
            f"{len(result.failed)} of {len(result.rows)} tensors under tolerance "
            f"{tolerance[0]:g},{tolerance[1]:g}: {names}")
    return 0


def run():
    cli.run(main, __doc__, positional=True)


if __name__ == "__main__":
    run()
