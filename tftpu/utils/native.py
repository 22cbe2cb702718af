"""Loading of tftpu's native kernels: plain shared libraries called through ctypes
(`load_library`), and TensorFlow custom ops (`load_op_library`).

Plain libraries (the INT8 kernels) are compiled when the package is installed, once per
instruction-set variant (`tftpu.utils.isa`: AVX-512 VNNI, AVX-VNNI, AVX-512, AVX2, generic),
and `load_library` opens the variant this CPU runs best (`TFTPU_ISA` forces one). Where the
installed build is missing or older than its source (a source checkout, an edited kernel), the
library is built on first use with the same variant's flags, in the manner of
`torch.utils.cpp_extension.load`, and cached under `$TFTPU_CACHE` (default
`~/.cache/tftpu`)/native, keyed by the source, the flags and the compiler. TensorFlow ops are
always built that way, with TensorFlow's own flags from `tf.sysconfig`. Concurrent first builds
(test workers, data-parallel jobs) wait on a file lock instead of compiling twice.
`TFTPU_NATIVE=0` turns native kernels off (callers fall back to their numpy/TensorFlow paths).

>>> ops = load_op_library(Path("tftpu/data/kernels/space_to_depth_op.cc"))  # doctest: +SKIP
>>> ops.tftpu_space_to_depth(images, [], [], block_size=2)  # doctest: +SKIP
>>> lib = load_library(Path("tftpu/interp/tpu/int8_native.cc"))  # a ctypes.CDLL  # doctest: +SKIP
>>> lib.tftpu_isa()  # doctest: +SKIP
b'avx2'
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from absl import logging

from tftpu.errors import TftpuError

from tftpu.utils import isa as isas

__all__ = ["NativeKernelError", "enabled", "load_op_library", "load_library", "cache_dir", "library_flags",
           "installed_path", "chosen_isa"]

_CXXFLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-Wno-deprecated-declarations")
#: The flags of every plain library, whatever its variant (setup.py builds with the same).
LIBFLAGS = ("-O3", "-fPIC", "-shared", "-std=c++17", "-ffp-contract=off")
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


def load_library(source, variant: str | None = None):
    """A `ctypes.CDLL` of the plain C++ library `source` (extern "C" entry points) in ISA
    `variant` (default `chosen_isa()`): the installed build, else one built now from source;
    NativeKernelError if impossible. ctypes releases the GIL during each call."""
    if not enabled():
        raise NativeKernelError("native kernels are turned off (TFTPU_NATIVE=0)")
    return _load_library(Path(source).resolve(), variant or chosen_isa())


def _built(source: Path, flags: list[str], link: list[str], salt: str) -> Path:
    """The cached library of `source` built with `flags` and `link`, built now if missing."""
    cxx = _compiler()
    parts = [source.read_text(), *flags, *link, _compiler_version(cxx), salt]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
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


def source_digest(source: Path) -> str:
    """The sha256 of a kernel's source, compiled into its library (a stale build is not loaded)."""
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def library_flags(source: Path, variant: str) -> list[str]:
    """The compiler flags of `source`'s library in ISA `variant` (setup.py uses them too)."""
    return [*LIBFLAGS, *isas.VARIANTS[variant].flags, f'-DTFTPU_ISA_NAME="{variant}"',
            f'-DTFTPU_SOURCE_SHA256="{source_digest(source)}"']


def installed_path(source: Path, variant: str) -> Path:
    """Where the install puts `source`'s library in `variant`: beside the source, named as an
    extension module (`_int8_native_avx2.cpython-311-x86_64-linux-gnu.so`)."""
    import importlib.machinery

    return Path(source).with_name(f"_{Path(source).stem}_{variant}{importlib.machinery.EXTENSION_SUFFIXES[0]}")


CPU_FEATURES = Path(__file__).with_name("cpu_features.cc")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's features (as /proc/cpuinfo names them) from CPUID, through the portable probe
    library; /proc/cpuinfo's where the probe cannot be had (no build, native kernels off)."""
    import ctypes

    try:
        lib = _load_library(CPU_FEATURES.resolve(), "generic")
    except NativeKernelError as exc:
        logging.info("tftpu: CPU features from /proc/cpuinfo (%s)", exc)
        return isas.cpu_flags()
    buf = ctypes.create_string_buffer(1024)
    lib.tftpu_cpu_flags.argtypes = [ctypes.c_char_p, ctypes.c_int]
    if lib.tftpu_cpu_flags(buf, len(buf)) < 0:
        return isas.cpu_flags()
    return frozenset(buf.value.decode().split())


def chosen_isa() -> str:
    """The variant this process loads: `$TFTPU_ISA`, else the best this CPU runs; a bad
    `TFTPU_ISA` is a ConfigError (a forced variant never falls back silently)."""
    from tftpu.errors import ConfigError

    try:
        return isas.chosen(cpu_flags() if isas.is_x86() else None)
    except isas.IsaError as exc:
        raise ConfigError(str(exc)) from None


def _open(path: Path):
    import ctypes

    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeKernelError(f"loading {path} failed: {exc}") from None
    for name in ("tftpu_isa", "tftpu_source_sha256"):
        if hasattr(lib, name):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = []
    return lib


@functools.cache
def _load_library(source: Path, variant: str):
    installed = installed_path(source, variant)
    if installed.is_file():
        lib = _open(installed)
        if getattr(lib, "tftpu_source_sha256", None) and lib.tftpu_source_sha256().decode() == source_digest(source):
            return lib
        logging.info("tftpu: %s is older than %s; building the kernel from source", installed.name, source.name)
    return _open(_built(source, library_flags(source, variant), [], variant))


@functools.cache
def _load(source: Path):
    import tensorflow as tf

    flags = [*_CXXFLAGS, *tf.sysconfig.get_compile_flags()]
    target = _built(source, flags, list(tf.sysconfig.get_link_flags()), tf.__version__)
    try:
        return tf.load_op_library(str(target))
    except (tf.errors.NotFoundError, OSError) as exc:
        raise NativeKernelError(f"loading {target} failed: {exc}") from None
