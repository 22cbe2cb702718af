"""Hardware plug-ins used by the tests (loaded by module path or file path, like users do)."""

from tftpu.tac import SimpleHardware, TargetHardware
from tftpu.tac.passes.lowerings import PATTERNS

LOWERED = ("PACK", "SPLIT", "SPLIT_V", "SUB", "SQUARED_DIFFERENCE", "FULLY_CONNECTED", "MEAN")


class LowerAll(SimpleHardware):
    """A fast float device that applies every lowering and lacks the ops they remove."""

    name = "LOWERALL"

    def transformations(self):
        return list(PATTERNS)

    def is_not_supported_op(self, op):
        if op.inference_type != "FLOAT" or op.name == "CUSTOM" or op.subgraph_refs():
            return True
        if op.op_type in LOWERED:
            return True
        g = op.graph
        if any(g.dtype(t) != "float32" for t in op.activations()):
            return True
        if op.op_type in ("SLICE", "CONCATENATION"):
            return any(len(g.shape(t)) != 4 for t in op.activations())
        return False

    def advantage_over_cpu(self):
        return 1000.0

    def __init__(self):
        super().__init__()
        self.transfer_us_per_byte = self.transfer_fixed_us = 0.0  # free to reach: always picked


class ConvOnly(TargetHardware):
    """An accelerator that runs only CONV_2D / DEPTHWISE_CONV_2D, at a flat cost per op."""

    name = "CONVONLY"

    def is_op_supported(self, op):
        return op.op_type in ("CONV_2D", "DEPTHWISE_CONV_2D") and op.inference_type == "FLOAT"

    def get_op_cost(self, op):
        return 0.01

    def get_hardware_switching_cost(self, from_hardware, buffer_size):
        return 0.0 if from_hardware.name == self.name else 0.001 * buffer_size
