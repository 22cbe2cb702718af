"""Build-once loading of tftpu's native kernels (C++ shipped as source): TensorFlow custom ops
(`load_op_library`) and plain shared libraries called through ctypes (`load_library`).

The first call compiles the kernel with the system C++ compiler (and, for TensorFlow ops,
TensorFlow's own flags from `tf.sysconfig`), in the manner of `torch.utils.cpp_extension.load`,
and caches the library under
`$TFTPU_CACHE` (default `~/.cache/tftpu`)/native, keyed by the source, the flags, the compiler
and the TensorFlow version. Later processes load the cached library; concurrent first builds (test
workers, data-parallel jobs) wait on a file lock instead of compiling twice. `TFTPU_NATIVE=0`
turns native kernels off (callers fall back to their pure-TensorFlow path).

>>> ops = load_op_library(Path("tftpu/data/kernels/space_to_depth_op.cc"))  # doctest: +SKIP
>>> ops.tftpu_space_to_depth(images, [], [], block_size=2)  # doctest: +SKIP
>>> lib = load_library(Path("tftpu/interp/tpu/int8_native.cc"))  # a ctypes.CDLL  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from absl import logging

from tftpu.errors import TftpuError

__all__ = ["NativeKernelError", "enabled", "load_op_library", "load_library", "cache_dir"]

_CXXFLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-Wno-deprecated-declarations")
_LIBFLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=c++17", "-ffp-contract=off")
_BUILD_TIMEOUT_S = 600


class NativeKernelError(TftpuError):
    """A native kernel could not be built or loaded (no compiler, build error, disabled)."""


def enabled() -> bool:
    """False when `TFTPU_NATIVE` is set to 0/false/off."""
    return os.environ.get("TFTPU_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    """Where built kernels are kept."""
    root = os.environ.get("TFTPU_CACHE") or Path.home() / ".cache" / "tftpu"
    return Path(root) / "native"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx or not shutil.which(cxx):
        raise NativeKernelError("no C++ compiler found (install g++ or set CXX) to build tftpu's native kernels")
    return cxx


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeKernelError(f"C++ compiler {cxx} does not run: {exc}") from None
    return out.stdout.splitlines()[0] if out.stdout else cxx


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(source: Path, target: Path, command: list[str]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        logging.info("tftpu: building native kernel %s (once; cached in %s)", source.name, target.parent)
        proc = subprocess.run(command + ["-o", tmp], capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "error" in line] or proc.stderr.splitlines()
            raise NativeKernelError(f"building {source.name} failed: {' | '.join(errors[:3])}")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise NativeKernelError(f"building {source.name} took over {_BUILD_TIMEOUT_S} s") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def load_op_library(source):
    """The op module of the C++ kernel `source`, built on first use; NativeKernelError if impossible."""
    if not enabled():
        raise NativeKernelError("native kernels are turned off (TFTPU_NATIVE=0)")
    return _load(Path(source).resolve())


def load_library(source):
    """A `ctypes.CDLL` of the plain C++ library `source` (extern "C" entry points), built on first
    use; NativeKernelError if impossible. ctypes releases the GIL during each call."""
    if not enabled():
        raise NativeKernelError("native kernels are turned off (TFTPU_NATIVE=0)")
    return _load_library(Path(source).resolve())


def _built(source: Path, flags: list[str], link: list[str], salt: str) -> Path:
    """The cached library of `source` built with `flags` and `link`, built now if missing."""
    cxx = _compiler()
    key = hashlib.sha256("\0".join([source.read_text(), *flags, *link, _compiler_version(cxx), salt,
                                     platform.machine()]).encode()).hexdigest()[:16]
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NativeKernelError(f"cannot create the kernel cache {directory}: {exc.strerror}") from None
    target = directory / f"{source.stem}-{key}.so"
    with _locked(directory / f"{source.stem}-{key}.lock"):
        if not target.exists():
            _build(source, target, [cxx, *flags, str(source), *link])
    return target


@functools.cache
def _cpu_features() -> str:
    """The CPU's feature flags (a library built with -march=native runs only where they match)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _load_library(source: Path):
    import ctypes

    target = _built(source, list(_LIBFLAGS), [], _cpu_features())
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeKernelError(f"loading {target} failed: {exc}") from None


@functools.cache
def _load(source: Path):
    import tensorflow as tf

    flags = [*_CXXFLAGS, *tf.sysconfig.get_compile_flags()]
    target = _built(source, flags, list(tf.sysconfig.get_link_flags()), tf.__version__)
    try:
        return tf.load_op_library(str(target))
    except (tf.errors.NotFoundError, OSError) as exc:
        raise NativeKernelError(f"loading {target} failed: {exc}") from None
