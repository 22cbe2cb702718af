"""Progress bars for long work (calibration, sweeps, compilation of big models).

A thin layer over tqdm: bars go to stderr, only when stderr is a terminal (or
``TFTPU_PROGRESS=1``; ``TFTPU_PROGRESS=0`` keeps them off, as a tool's ``--noprogress`` does),
so logs and CI output stay clean and outputs stay deterministic. A bar shows the items per
second and, where the total is known, the time left.

>>> for batch in progress(range(3), desc="calibrating"):
...     pass
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def enabled() -> bool:
    """Whether progress bars are shown in this process."""
    flag = os.environ.get("TFTPU_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "False")
    return sys.stderr.isatty()


def show(on: bool | None) -> None:
    """Turn progress bars on or off for this process (None: only when stderr is a terminal)."""
    if on is None:
        os.environ.pop("TFTPU_PROGRESS", None)
    else:
        os.environ["TFTPU_PROGRESS"] = "1" if on else "0"


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None,
             unit: str = "it") -> Iterable[T]:
    """Wrap `iterable` in a progress bar when progress display is enabled."""
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr,
                disable=not enabled(), leave=False, dynamic_ncols=True)
