"""INT8 calibration of TOP models: tensor statistics, threshold methods and the calibration table.

>>> samples = tftpu.quant.load_samples(model, "images/", input_num=20, mean=127.5, scale=1 / 127.5)  # doctest: +SKIP
>>> table = tftpu.quant.calibrate(model, samples, method="kl")  # doctest: +SKIP
>>> stream = tftpu.quant.iter_samples(model, "val/*.jpg", mean=127.5, scale=1 / 127.5)  # lazy  # doctest: +SKIP
>>> table = tftpu.quant.calibrate(model, stream)  # one image in memory at a time  # doctest: +SKIP
>>> table = tftpu.quant.calibrate(model, samples, method="auto", asymmetric=True)  # doctest: +SKIP
>>> table.save("model_cali_table")  # doctest: +SKIP
>>> print(tftpu.quant.evaluate(model, table, samples))  # simulated INT8 vs float  # doctest: +SKIP
"""

from tftpu.quant.calibrate import (AUTO_CANDIDATES, BINS, CALIBRATION_METHODS, TUNE_NUM, calibrate, calibrate_each,
                                   calibrate_two_pass)
from tftpu.quant.dataset import Samples, iter_samples, load_samples
from tftpu.quant.simulation import Evaluation, evaluate, simulate
from tftpu.quant.table import CalibrationTable, read_table
from tftpu.quant.thresholds import METHODS

__all__ = ["calibrate", "calibrate_each", "calibrate_two_pass", "load_samples", "iter_samples", "Samples",
           "CalibrationTable", "read_table", "METHODS", "CALIBRATION_METHODS", "AUTO_CANDIDATES", "BINS", "TUNE_NUM",
           "simulate", "evaluate", "Evaluation"]
