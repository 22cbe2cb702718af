"""tftpu's converter options: their names, the TF settings a rebuilt converter copies, checks."""

from __future__ import annotations

import contextlib
import shutil
import tempfile

from tftpu import errors

TFTPU_OPTIONS = ("device_specs", "space_to_depth", "s2d_input", "s2d_target", "calibration_method")


def settings(converter) -> dict:
    """The user-settable attributes of TF's converter (public ones and `_experimental_*`)."""
    return {k: v for k, v in vars(converter).items()
            if (not k.startswith("_") or k.startswith("_experimental_")) and k not in ("report",)
            and k not in TFTPU_OPTIONS}


@contextlib.contextmanager
def scratch_dir(prefix: str):
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_options(converter) -> None:
    """Refuse malformed tftpu options before any work, one line each."""
    s2d = converter.space_to_depth
    if not (s2d is None or s2d is False or s2d is True or
            (isinstance(s2d, int) and not isinstance(s2d, bool) and s2d >= 2)):
        raise errors.UsageError(f"space_to_depth={s2d!r}: expected True (the cost model decides) or a block "
                                f"size >= 2")
    if converter.s2d_input and (s2d is None or s2d is False):
        raise errors.UsageError("s2d_input=True needs space_to_depth")
    if converter.calibration_method is not None:
        from tftpu.lite.calibration import check_method

        check_method(converter.calibration_method)
        if converter.representative_dataset is None:
            raise errors.UsageError("calibration_method needs a representative_dataset (INT8 calibration)")
