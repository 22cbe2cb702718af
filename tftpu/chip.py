"""The one typed chip model, read from `tftpu/configs/chips/NAME.yaml` (or a YAML path).

A chip is what every hardware-aware part of tftpu reads: the S2D cost model (its matrix unit,
memory and host), the layout planner (lanes, alignment, preferred memory formats), and the TPU
lowering and backend (modes, MACs per cycle, local memory, clock). Every field is read and
checked: a missing, unknown or bad field is one `ConfigError` naming the file and the field.

>>> chip = load("npu1")                    # doctest: +SKIP
>>> chip.lanes, chip.peak_flops("i8")      # doctest: +SKIP
(64, 8.192e12)
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from tftpu.errors import ConfigError
from tftpu.utils import config

__all__ = ["Chip", "MatrixUnit", "Host", "MemoryFormat", "NCHW", "NHWC", "FORMAT_KINDS", "MODES", "load",
           "known", "from_data"]

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "u8": 1, "i16": 2, "i32": 4}
MODES = {"F32": "f32", "BF16": "bf16", "F16": "f16", "INT8": "i8"}   # mode -> the dtype it computes in
FORMAT_KINDS = ("NCHW", "NHWC", "lane_blocked")
_FORMAT = re.compile(r"^(NCHW|NHWC|lane_blocked(:\d+(:\d+)?)?)$")


# ---------------------------------------------------------------- memory formats

def _align_up(n: int, a: int) -> int:
    return -(-n // a) * a if a > 1 else n


@dataclasses.dataclass(frozen=True)
class MemoryFormat:
    """How an activation's bytes lie in a memory. Shapes given to its methods are logical NCHW
    (N, C, *spatial), as oneDNN and PyTorch describe sizes whatever the memory format.

    `lane_blocked`: channel c lives in NPU lane c % lanes at channel slot c // lanes; each lane
    holds [N, ceil(C / lanes), *spatial], every (n, slot) plane starting at a multiple of
    `align` bytes (the EU width; 0 or 1 = compact), as TPU-MLIR lays tensors in local memory.
    """

    kind: str
    lanes: int = 0
    align: int = 0

    def __post_init__(self):
        if self.kind not in FORMAT_KINDS:
            raise ConfigError(f"memory format must be one of {FORMAT_KINDS}, got {self.kind!r}")
        if self.kind == "lane_blocked" and self.lanes < 1:
            raise ConfigError("lane_blocked format needs lanes >= 1")

    @classmethod
    def parse(cls, text: str) -> "MemoryFormat":
        """"NCHW", "NHWC", "lane_blocked:LANES" or "lane_blocked:LANES:ALIGN_BYTES"."""
        parts = str(text).split(":")
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(f"bad memory format {text!r}") from None
        if parts[0] != "lane_blocked" and nums or len(nums) > 2:
            raise ConfigError(f"bad memory format {text!r}")
        return cls(parts[0], *nums)

    def __str__(self) -> str:
        if self.kind != "lane_blocked":
            return self.kind
        return f"lane_blocked:{self.lanes}" + (f":{self.align}" if self.align > 1 else "")

    def per_lane_bytes(self, shape, itemsize: int) -> int:
        """Bytes one lane holds (the whole tensor for NCHW/NHWC)."""
        n, c, sp = shape[0], shape[1], math.prod(shape[2:])
        if self.kind != "lane_blocked":
            return n * c * sp * itemsize
        return n * -(-c // self.lanes) * _align_up(sp * itemsize, self.align)

    def nbytes(self, shape, itemsize: int) -> int:
        """Bytes the tensor occupies, padding included (over all lanes)."""
        lanes = self.lanes if self.kind == "lane_blocked" else 1
        return lanes * self.per_lane_bytes(shape, itemsize)

    def address(self, index, shape, itemsize: int) -> tuple[int, int]:
        """(lane, byte offset in that lane) of the element at logical NCHW `index`."""
        n, c, *sp = index
        dims = list(shape[2:])
        flat_sp = 0
        for i, d in zip(sp, dims):
            flat_sp = flat_sp * d + i
        plane = math.prod(dims)
        if self.kind == "NCHW":
            return 0, ((n * shape[1] + c) * plane + flat_sp) * itemsize
        if self.kind == "NHWC":
            return 0, ((n * plane + flat_sp) * shape[1] + c) * itemsize
        slots = -(-shape[1] // self.lanes)
        stride = _align_up(plane * itemsize, self.align)
        return c % self.lanes, (n * slots + c // self.lanes) * stride + flat_sp * itemsize


NCHW = MemoryFormat("NCHW")
NHWC = MemoryFormat("NHWC")


# ---------------------------------------------------------------- the chip

@dataclasses.dataclass(frozen=True)
class MatrixUnit:
    """The unit convolutions and matmuls run on, as the S2D cost model and the cycle model price it."""

    contraction: str        # per_tap: one matmul per kernel tap over C_in; im2col: one over k*k*C_in
    rows: int               # contraction lanes (input channels per pass)
    cols: int               # output-channel lanes
    dtype: str              # the dtype it computes in (its peak and operand bytes)

    def issued_macs(self, pixels: int, taps: int, in_channels: int, out_channels: int) -> int:
        """Multiply-adds the unit issues for a conv (a matmul is one tap): the contraction padded
        to its rows (per tap, or over the im2col row) and the outputs padded to its columns."""
        cols = -(-out_channels // self.cols) * self.cols
        if self.contraction == "per_tap":
            return pixels * taps * (-(-in_channels // self.rows) * self.rows) * cols
        return pixels * (-(-(taps * in_channels) // self.rows) * self.rows) * cols


@dataclasses.dataclass(frozen=True)
class Host:
    """The host that feeds the chip (runs the space-to-depth input transform)."""

    bandwidth: float        # bytes/s of the host transform
    overlap: float          # share of host time hidden behind the chip, in [0, 1]
    flops: float            # FLOP/s the host computes at (ops TAC's pick places on it)


@dataclasses.dataclass(frozen=True)
class Chip:
    """A chip: lanes, memories, clock, arithmetic, modes and preferred formats."""

    name: str
    description: str
    lanes: int                          # NPU lanes (channels processed side by side)
    eu_bytes: int                       # bytes a lane's execution unit takes per cycle; alignment
    local_mem_bytes: int                # all lanes together
    ddr_bandwidth: float                # bytes/s between DDR and local memory
    reorder_bandwidth: float            # bytes/s of a DDR -> DDR format change
    frequency_hz: float
    macs_per_cycle: dict                # dtype -> MACs per cycle per lane
    modes: tuple[str, ...]              # quantization modes it runs: F32, BF16, F16, INT8
    dtypes: tuple[str, ...]             # element types it stores
    matrix: MatrixUnit
    host: Host
    s2d_min_speedup: float              # apply S2D only when it is estimated this much faster
    formats: dict                       # "top.Conv" / "io" / "default" -> memory format text
    path: str = ""
    conv_overhead_us: float = 0.0       # optional: fixed time of each convolution (launches, set-up), us

    def peak_flops(self, dtype: str | None = None) -> float:
        """FLOP/s at full utilisation: 2 x lanes x MACs per cycle per lane x clock."""
        return 2.0 * self.lanes * self.macs_per_cycle[dtype or self.matrix.dtype] * self.frequency_hz

    @property
    def local_mem_per_lane(self) -> int:
        return self.local_mem_bytes // self.lanes

    def format_for(self, op_name: str) -> MemoryFormat:
        """The memory format the op `op_name` (full name, `top.Conv`) wants its data in."""
        return self.resolve(self.formats.get(op_name, self.formats["default"]))

    def resolve(self, text: str) -> MemoryFormat:
        """A format name from the config, `lane_blocked` filled in with the chip's lanes/EU width."""
        return MemoryFormat(text, self.lanes, self.eu_bytes) if text == "lane_blocked" else MemoryFormat.parse(text)

    def data_layout(self, op_name: str) -> str:
        """The TOP data layout (NCHW/NHWC) that leads to `op_name`'s memory format: NHWC for
        NHWC; NCHW for NCHW and for lane_blocked, which splits NCHW's channel axis over lanes."""
        return "NHWC" if self.format_for(op_name).kind == "NHWC" else "NCHW"

    @property
    def io_format(self) -> MemoryFormat:
        """Format of model inputs and outputs in DDR."""
        return self.resolve(self.formats["io"])


# ---------------------------------------------------------------- loading and checking

class _Fields:
    """Reads a mapping's fields one by one, each error naming the file and the field."""

    def __init__(self, data: dict, path: Path, prefix: str = ""):
        self.data, self.path, self.prefix, self.read = data, path, prefix, set()

    def fail(self, key: str, reason: str):
        raise ConfigError(f"{self.path}: field '{self.prefix}{key}': {reason}")

    def get(self, key: str, kind: type, *, positive: bool = False, at_least: float | None = None,
            at_most: float | None = None, choices=None):
        self.read.add(key)
        if key not in self.data:
            self.fail(key, "missing")
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif kind is float and isinstance(value, str):   # YAML 1.1 reads 2.0e10 (no exponent sign) as text
            try:
                value = float(value)
            except ValueError:
                self.fail(key, f"expected a number, got {value!r}")
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            self.fail(key, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        if kind is float and not math.isfinite(value):
            self.fail(key, f"must be finite, got {value!r}")
        if positive and value <= 0:
            self.fail(key, f"must be positive, got {value!r}")
        if at_least is not None and value < at_least:
            self.fail(key, f"must be at least {at_least}, got {value!r}")
        if at_most is not None and value > at_most:
            self.fail(key, f"must be at most {at_most}, got {value!r}")
        if choices is not None and value not in choices:
            self.fail(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def section(self, key: str) -> "_Fields":
        return _Fields(self.get(key, dict), self.path, f"{self.prefix}{key}.")

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.read)
        if unknown:
            self.fail(unknown[0], "unknown field" + (f" (also {', '.join(unknown[1:])})" if unknown[1:] else ""))


def _strings(f: _Fields, key: str, allowed) -> tuple[str, ...]:
    values = f.get(key, list)
    if not values:
        f.fail(key, "must not be empty")
    for v in values:
        if v not in allowed:
            f.fail(key, f"{v!r} is not one of {', '.join(allowed)}")
    return tuple(values)


def _read(data: dict, path: Path) -> Chip:
    f = _Fields(data, path)
    name = f.get("name", str)
    description = f.get("description", str)
    lanes = f.get("npu_lanes", int, positive=True, at_most=1 << 16)
    eu_bytes = f.get("eu_bytes", int, positive=True, at_most=1 << 16)
    local_mem = f.get("local_mem_bytes", int, positive=True)
    if local_mem % lanes:
        f.fail("local_mem_bytes", f"{local_mem} does not split evenly over {lanes} lanes")
    ddr = f.get("ddr_bandwidth", float, positive=True)
    reorder = f.get("reorder_bandwidth", float, positive=True)
    clock = f.get("frequency_hz", float, positive=True)
    dtypes = _strings(f, "dtypes", DTYPE_BYTES)
    macs_raw = f.section("macs_per_cycle")
    macs = {}
    for dtype in list(macs_raw.data):
        if dtype not in dtypes:
            macs_raw.fail(dtype, f"not one of the chip's dtypes ({', '.join(dtypes)})")
        macs[dtype] = macs_raw.get(dtype, int, positive=True)
    macs_raw.done()
    modes = _strings(f, "modes", MODES)
    for mode in modes:
        if MODES[mode] not in macs:
            f.fail("modes", f"{mode} computes in {MODES[mode]}, which macs_per_cycle does not list")
    m = f.section("matrix_unit")
    matrix = MatrixUnit(m.get("contraction", str, choices=("per_tap", "im2col")), m.get("rows", int, positive=True),
                        m.get("cols", int, positive=True), m.get("dtype", str, choices=tuple(macs)))
    m.done()
    h = f.section("host")
    host = Host(h.get("bandwidth", float, positive=True), h.get("overlap", float, at_least=0.0, at_most=1.0),
                h.get("flops", float, positive=True))
    h.done()
    min_speedup = f.get("s2d_min_speedup", float, positive=True)
    overhead = f.get("conv_overhead_us", float, at_least=0.0) if "conv_overhead_us" in f.data else 0.0
    fm = f.section("formats")
    formats = {}
    for key in list(fm.data):
        if key not in ("io", "default") and not re.fullmatch(r"[a-z]+\.[A-Za-z0-9]+", str(key)):
            fm.fail(key, "expected io, default or a full op name such as top.Conv")
        text = fm.get(key, str)
        if not _FORMAT.match(text):
            fm.fail(key, f"{text!r} is not NCHW, NHWC or lane_blocked[:LANES[:ALIGN]]")
        formats[key] = text
    for key in ("io", "default"):
        if key not in formats:
            fm.fail(key, "missing")
    fm.done()
    f.done()
    return Chip(name, description, lanes, eu_bytes, local_mem, ddr, reorder, clock, macs, modes, dtypes, matrix,
                host, min_speedup, formats, str(path), overhead)


def from_data(data, where: str) -> Chip:
    """A chip from a parsed YAML mapping (e.g. the copy a `.tpumodel` embeds); `where` names it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return _read(data, Path(where))


_CACHE: dict = {}


def load(name_or_path) -> Chip:
    """The chip `tftpu/configs/chips/NAME.yaml` (honouring $TFTPU_CONFIGS) or a YAML path."""
    if isinstance(name_or_path, Chip):
        return name_or_path
    path = config.resolve("chips", name_or_path, "chip config")
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = _read(config.load_yaml(path, "chip config"), path)
    return _CACHE[key]


def known() -> list[str]:
    """Names of the chips available."""
    return config.known("chips")

