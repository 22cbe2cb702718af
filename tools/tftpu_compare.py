"""tftpu-compare: similarity of two .npz files, tensor by tensor.

    tftpu-compare a.npz b.npz --tolerance=0.99,0.99
"""

from absl import flags

from tftpu import cli

flags.DEFINE_string("tolerance", "0.99,0.99", "minimum cosine,euclidean similarity")

main = cli.not_yet_available("tftpu-compare", "TOP dialect issue")


def run():
    cli.run(main, __doc__, positional=True)


if __name__ == "__main__":
    run()
