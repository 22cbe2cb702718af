"""The instruction-set variants tftpu's native kernels are built in, and which one this CPU runs.

Each native library is compiled once per variant when the package is installed (setup.py reads
`VARIANTS` from this file, which therefore imports nothing but the standard library); at run
time `chosen()` picks the best variant the CPU supports, as numpy and onnxruntime dispatch, and
`TFTPU_ISA=<name>` forces one (tests run every variant the machine can execute).

>>> chosen() in VARIANTS  # doctest: +SKIP
True
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

__all__ = ["Variant", "VARIANTS", "IsaError", "cpu_flags", "supported", "chosen", "is_x86"]


@dataclass(frozen=True)
class Variant:
    """One build of the kernels: compiler flags and the /proc/cpuinfo flags a CPU needs to run it."""

    name: str
    flags: tuple[str, ...]
    needs: frozenset[str]
    summary: str


# x86-64-v3 as /proc/cpuinfo names it (lzcnt is "abm")
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}

#: Best first: `chosen()` takes the first one the CPU supports.
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("avx512_vnni", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"},
            "AVX-512 with VNNI: int8 GEMM by vpdpbusd on 512-bit vectors"),
    Variant("avx_vnni", ("-march=x86-64-v3", "-mavxvnni"), _V3 | {"avx_vnni"},
            "AVX2 with AVX-VNNI: int8 GEMM by vpdpbusd on 256-bit vectors"),
    Variant("avx512", ("-march=x86-64-v4",), _V4, "AVX-512 without VNNI"),
    Variant("avx2", ("-march=x86-64-v3",), _V3, "AVX2 and FMA: int8 GEMM by vpmaddwd on int16 pairs"),
    Variant("generic", (), frozenset(), "portable C++ for any CPU"),
)}


class IsaError(ValueError):
    """`TFTPU_ISA` names an unknown variant, or one this CPU cannot run."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none); tftpu.utils.native
    asks CPUID itself where it can (`native.cpu_flags`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def buildable() -> list[str]:
    """The variants compiled on this platform: all on x86-64, the generic one elsewhere."""
    return list(VARIANTS) if is_x86() else ["generic"]


def supported(flags: frozenset[str] | None = None) -> list[str]:
    """The variants this CPU (or one with `flags`) can run, best first."""
    flags = cpu_flags() if flags is None else flags
    return [name for name in buildable() if VARIANTS[name].needs <= flags]


def chosen(flags: frozenset[str] | None = None) -> str:
    """`$TFTPU_ISA` if set (IsaError if unknown or not runnable here), else the best variant this
    CPU (or one with `flags`) supports."""
    flags = cpu_flags() if flags is None else flags
    forced = os.environ.get("TFTPU_ISA", "").strip().lower()
    runnable = supported(flags)
    if not forced:
        return runnable[0]
    if forced not in VARIANTS:
        raise IsaError(f"TFTPU_ISA={forced}: unknown (known: {', '.join(VARIANTS)})")
    if forced not in runnable:
        missing = sorted(VARIANTS[forced].needs - flags)
        raise IsaError(f"TFTPU_ISA={forced}: this CPU cannot run it (lacks {', '.join(missing)}); "
                       f"it runs {', '.join(runnable)}")
    return forced
