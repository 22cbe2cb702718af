"""A tool's output paths, checked before it does any work.

Each file a tool writes is written atomically (`tftpu.utils.files`), but a run that fails half
way through its outputs would still leave the ones written before, and an output that names an
input (or another output, or a device) would silently replace it. `check` refuses all of that up
front, with one `UsageError` / `OutputError` (exit status 2) naming the flags and the path:

- an output that is the same file as an input or as another output (resolved paths compared,
  `os.path.samefile` where both exist), side files included (the weights `.npz` beside an
  `.mlir`: `mlir_weights` finds the one an existing `.mlir` names);
- an output that exists and is not a regular file (a directory, a device, a fifo, a socket);
- an output whose nearest existing parent is not a directory this process can create files in
  (probed by creating and removing an empty temporary file there), or whose name is too long.

>>> check([("--mlir", "m.onnx")], [("--model_def", "m.onnx")])
Traceback (most recent call last):
...
tftpu.errors.UsageError: --mlir and --model_def name the same file: m.onnx (an output would replace an input)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Tuple, Union

from tftpu.errors import OutputError, UsageError

PathLike = Union[str, "os.PathLike[str]"]
Named = Iterable[Tuple[str, Optional[PathLike]]]

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"))


def check(outputs: Named, inputs: Named = (), directories: Named = ()) -> None:
    """Refuse, before anything is read or written, outputs that would clobber data or cannot all
    be written. `outputs` and `inputs` are `(label, path)` pairs (the label names the flag, e.g.
    "--mlir" or "--mlir's weights"); a pair whose path is None or empty is skipped. `directories`
    are directory outputs (`--output_dir`): not compared as files, only refused where they are an
    input or hold one, or their parent cannot be written."""
    outs = [(label, os.fspath(p)) for label, p in outputs if p]
    ins = [(label, os.fspath(p)) for label, p in inputs if p]
    dirs = [(label, os.fspath(p)) for label, p in directories if p]
    for i, (label, path) in enumerate(outs):
        for other, earlier in outs[:i]:
            if _same(path, earlier):
                raise UsageError(f"{other} and {label} name the same file: {earlier}")
        for other, source in ins:
            if _same(path, source):
                raise UsageError(f"{label} and {other} name the same file: {path} (an output would replace an input)")
    for label, path in dirs:
        for other, source in ins:
            if _same(path, source) or _inside(source, path):
                raise UsageError(f"{label}={path} would replace {other}={source}")
    probed: dict[str, None] = {}
    for label, path in outs:
        _writable_file(label, path, probed)
    for label, path in dirs:
        _writable_parent(label, Path(path), probed)


def mlir_weights(mlir: PathLike | None) -> Path | None:
    """The weights `.npz` an existing `.mlir` file names (`module.weight_file`, relative to it);
    None where it is not one or cannot be read."""
    found = _module_attribute(mlir, "weight_file")
    return Path(mlir).parent / found if found else None


def mlir_name(mlir: PathLike | None) -> str | None:
    """The model name (`module.name`) of an existing `.mlir` file; None where it is not one or
    cannot be read."""
    return _module_attribute(mlir, "name")


def _module_attribute(mlir, key: str) -> str | None:
    """A plain string attribute of the module, read from the attributes at the end of the file."""
    if not mlir or not str(mlir).endswith(".mlir") or not os.path.isfile(mlir):   # (a fifo would block)
        return None
    try:
        with open(mlir, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    found = re.findall(rf'module\.{key} = "([^"\\]*)"', tail)
    return found[-1] if found else None


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _inside(path: str, directory: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real.startswith(top.rstrip(os.sep) + os.sep)


def _writable_file(label: str, path: str, probed: dict) -> None:
    p = Path(path)
    if len(os.fsencode(p.name)) > 255:
        raise OutputError(p, f"file name too long ({label})")
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):     # (a parent that is a file: named below)
        st = None
    except OSError as e:
        raise OutputError(p, f"{_reason(e)} ({label})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(p, f"is a directory ({label})")
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise OutputError(p, f"is {kind}, not a regular file ({label})")
    _writable_parent(label, p, probed)


def _writable_parent(label: str, p: Path, probed: dict) -> None:
    """The nearest existing parent of `p` (missing ones are made when written) is a directory
    a file can be created in."""
    try:
        parent = next((q for q in p.absolute().parents if q.exists()), None)
    except OSError as e:
        raise OutputError(p, f"{_reason(e)} ({label})") from None
    if parent is None or str(parent) in probed:
        return
    if not parent.is_dir():
        raise OutputError(p, f"{parent} is not a directory ({label})")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tftpu-probe.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise OutputError(p, f"{parent} is not a writable directory: {_reason(e)} ({label})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    probed[str(parent)] = None


def _reason(e: OSError) -> str:
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return (e.strerror or str(e)).lower()
