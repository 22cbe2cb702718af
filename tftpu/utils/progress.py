"""Progress bars for long work (calibration, sweeps, compilation of big models).

A thin layer over tqdm: bars go to stderr, only when stderr is a terminal (or
``TFTPU_PROGRESS=1``), so logs and CI output stay clean and outputs stay deterministic.

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


def progress(iterable: Iterable[T], desc: str = "", total: int | None = None,
             unit: str = "it") -> Iterable[T]:
    """Wrap `iterable` in a progress bar when progress display is enabled."""
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr,
                disable=not enabled(), leave=False, dynamic_ncols=True)
