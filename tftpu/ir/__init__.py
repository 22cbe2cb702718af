"""tftpu.ir: the TOP and TPU dialects (xDSL), quantized types, their text form and weight files.

>>> from tftpu import ir
>>> model = ir.load("resnet.top.mlir")  # doctest: +SKIP
"""

from tftpu.ir.module import (
    TopBuilder,
    TopModel,
    TpuModel,
    context,
    default_weight_file,
    load,
    make_op,
    parse_module,
    print_module,
    value_name,
)
from tftpu.ir.top import FLOPS, OPS_BY_NAME, TOP_OPS, Top, TopOp, loc_name, loc_names, set_loc
from tftpu.ir.weights import load_npz, npz_bytes, save_npz

__all__ = [
    "TopBuilder", "TopModel", "TpuModel", "context", "default_weight_file", "load", "make_op", "parse_module",
    "print_module", "value_name", "FLOPS", "OPS_BY_NAME", "TOP_OPS", "Top", "TopOp",
    "loc_name", "loc_names", "set_loc", "load_npz", "npz_bytes", "save_npz",
]
