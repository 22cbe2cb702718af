"""INT8 calibration of TOP models: tensor statistics, threshold methods and the calibration table.

>>> samples = tftpu.quant.load_samples(model, "images/", input_num=20, mean=127.5, scale=1 / 127.5)  # doctest: +SKIP
>>> table = tftpu.quant.calibrate(model, samples, method="kl")  # doctest: +SKIP
>>> table.save("model_cali_table")  # doctest: +SKIP
>>> print(tftpu.quant.evaluate(model, table, samples))  # simulated INT8 vs float  # doctest: +SKIP
"""

from tftpu.quant.calibrate import BINS, calibrate
from tftpu.quant.dataset import load_samples
from tftpu.quant.simulation import Evaluation, evaluate, simulate
from tftpu.quant.table import CalibrationTable, read_table
from tftpu.quant.thresholds import METHODS

__all__ = ["calibrate", "load_samples", "CalibrationTable", "read_table", "METHODS", "BINS", "simulate",
           "evaluate", "Evaluation"]
