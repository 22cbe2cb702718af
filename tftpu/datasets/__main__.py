"""Fetch and check every `tftpu.datasets` file: ``python -m tftpu.datasets`` (prints sha256 and path).

The mtcnn `.npz` files are made outside the package (tftpu never unpickles); where they are not
made yet this says how, and exits 1.
"""

import sys

from tftpu import datasets
from tftpu.errors import DatasetError


def main() -> int:
    status = 0
    for name in datasets.names():
        try:
            path = datasets.get(name)
        except DatasetError as e:
            print(f"python -m tftpu.datasets: error: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{datasets.sha256(path)}  {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
