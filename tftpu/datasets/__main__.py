"""Fetch and check `tftpu.datasets` files from the command line.

    python -m tftpu.datasets                      # every file: prints sha256 and path
    MODEL=$(python -m tftpu.datasets selfie_segmentation.tflite)   # the named files' paths

The mtcnn `.npz` files are made outside the package (tftpu never unpickles); where they are not
made yet this says how. Exit status: 0, 1 when a file could not be had, 2 for an unknown name.
"""

import sys

from tftpu import datasets
from tftpu.errors import DatasetError

PROG = "python -m tftpu.datasets"


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nnames: " + ", ".join(datasets.names()))
        return 0
    if argv:
        try:
            paths = [datasets.get(name) for name in argv]
        except DatasetError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2 if "unknown dataset" in str(e) else 1
        print("\n".join(str(p) for p in paths))
        return 0
    status = 0
    for name in datasets.names():
        try:
            path = datasets.get(name)
        except DatasetError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{datasets.sha256(path)}  {path}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
