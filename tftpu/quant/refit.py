"""Noise-aware refit of a conv's weights and bias: the least-squares map from the INT8 model's
own (quantized, upstream-rounded) inputs to the float model's output, as AdaQuant does
(Hubara et al. 2021) in closed form.

A conv fed 8-bit activations passes their rounding noise on; a high-pass filter (a depthwise
edge detector, the difference of two branches folded into one kernel) amplifies it relative to
its signal, and a deep MobileNet-style detector compounds that layer after layer (PP-OCRv4's
text detector loses 6-8 dB in single convs). Fitted to what the INT8 model really feeds it,
`min ||X_f W^T + b - X_q V^T - c||^2 + lam ||(V, c) - (W, b)||^2` over the calibration samples
(X_f, X_q: the float and the simulated-INT8 input patches), a conv's kernel becomes the Wiener
filter of its noisy input: it keeps its gain where the input carries signal and lowers it where
the input carries mostly noise, and the bias takes back the mean shift. The ridge pulls towards
the float weights (`lam` in units of the inputs' mean power), so a fit on a few photos does not
learn their particular noise; without it the fit holds on the photos it saw and fails on the next.
"""

from __future__ import annotations

import numpy as np

from tftpu.quant import params as P
from tftpu.quant.weight_rounding import conv_patches, gptq, keep_scale
from tftpu.utils import spd

__all__ = ["Fit", "RIDGE", "MAX_ROWS", "INPUT_BUDGET", "MAX_SAMPLES", "ROUNDINGS"]

# lam over the mean diagonal of X_q^T X_q, per group. Measured on PP-OCRv4's detector (8 photos,
# judged on two held-out text photos): 0.3 and 1 fit alike, 3 gives back half the gain, 0 learns
# the photos' own noise and loses on the next photo
RIDGE = 1.0
MAX_ROWS = 1 << 12       # input patches per image and conv (evenly spaced output rows), at most
# and fewer for a wide conv: rows * (weights a channel)^2 stays under this many multiply-adds per
# image (a 3x3 conv over 64 channels: 1024 rows; over 96 or more: MIN_ROWS), so a detector's wide
# 3x3 convs do not hold the refit up (4x this budget fit no better: the quantization guide has the figures)
GRAM_BUDGET = 256 * 1153 ** 2
MIN_ROWS = 512
# the fit's samples hold at most this many input values together: 8 images of 640x640 (4 fit a
# 640x640 detector clearly worse)
INPUT_BUDGET = 8 * 3 * 640 * 640
# and at most this many images, where smaller ones fit the budget (the full palm detector, 192x192:
# 8 -> 16 photos lift its held-out photo 19.6 -> 20.5 dB)
MAX_SAMPLES = 16


ROUNDINGS = ("nearest", "gptq")     # how a refit conv's weights reach their INT8 grid


def _grams(pq: np.ndarray, pf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(X_q^T X_q, X_q^T X_f) per group of one block of patches stored rows last [g, d + 1, rows]."""
    return pq @ np.swapaxes(pq, 1, 2), pq @ np.swapaxes(pf, 1, 2)


class Fit:
    """The normal equations of one conv (NCHW input, OIHW filter `w` [O, C/g, kh, kw], bias `b`),
    gathered one image at a time, then solved for the refit weights and bias."""

    def __init__(self, w: np.ndarray, b: np.ndarray, attrs: dict):
        self.attrs, self.shape = attrs, w.shape
        self.group = int(attrs.get("group", 1) or 1)
        o, d = w.shape[0], int(np.prod(w.shape[1:]))
        # [g, d + 1, O/g]: each group's filter rows with the bias as one more input (a constant 1)
        self.wb = np.concatenate([np.asarray(w, np.float64).reshape(self.group, o // self.group, d),
                                  np.asarray(b, np.float64).reshape(self.group, o // self.group, 1)], 2)
        self.wb = np.swapaxes(self.wb, 1, 2)
        self.qq = np.zeros((self.group, d + 1, d + 1))
        self.qf = np.zeros((self.group, d + 1, d + 1))
        self.rows = 0
        self.patches: list = []     # (X_q, X_f) blocks kept as they are while fewer rows than unknowns

    def observe(self, x_float: np.ndarray, x_quant: np.ndarray) -> None:
        self.add(self.products(x_float, x_quant))

    def products(self, x_float: np.ndarray, x_quant: np.ndarray) -> list:
        """One image's blocks of (X_q^T X_q, X_q^T X_f, rows, False), not yet summed: images may
        be gathered on several threads, then `add`ed in order (the same sums on any count). An
        image with fewer patch rows than a channel has unknowns (a wide conv deep in a small map)
        gives its patches (X_q, X_f, rows, True) instead: `solve` may then work in their row space."""
        kernel = tuple(self.attrs.get("kernel_shape") or self.shape[2:])
        d1 = self.qq.shape[1]
        rows = int(min(MAX_ROWS, max(MIN_ROWS, GRAM_BUDGET // d1 ** 2)))
        out = []
        for pf, pq in zip(conv_patches(x_float, kernel, self.attrs, rows, ones=True),
                          conv_patches(x_quant, kernel, self.attrs, rows, ones=True)):
            out.append((pq, pf, pf.shape[2], True) if pq.shape[2] < d1 else (*_grams(pq, pf), pf.shape[2], False))
        return out

    def add(self, products: list) -> None:
        for a, b, rows, patches in products:
            if patches:
                self.patches.append((a, b))
            else:
                self.qq += a
                self.qf += b
            self.rows += rows
        if self.patches and self.rows >= self.qq.shape[1]:    # enough rows: their products from here on
            for pq, pf in self.patches:
                qq, qf = _grams(pq, pf)
                self.qq += qq
                self.qf += qf
            self.patches = []

    def solve(self, ridge: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(weights [O, C/g, kh, kw], bias [O]) refit, float64; `ridge` RIDGE by default. With
        fewer input rows than unknowns, the same solution from the rows' side (Woodbury:
        `WB + X_q^T (X_q X_q^T + lam I)^-1 (X_f - X_q) WB`): an R x R system for R rows instead
        of the unknowns' square (a 3x3 conv over 512 channels: 4,609)."""
        ridge = RIDGE if ridge is None else ridge
        d1 = self.qq.shape[1]
        if self.patches:
            xq = np.swapaxes(np.concatenate([pq for pq, _ in self.patches], 2), 1, 2).astype(np.float64)  # [g, R, d + 1]
            xf = np.swapaxes(np.concatenate([pf for _, pf in self.patches], 2), 1, 2).astype(np.float64)
            power = np.einsum("grd,grd->gd", xq, xq)[:, :-1].mean(axis=1)
            lam = ridge * np.maximum(power, 1e-30)[:, None, None]
            k = xq @ np.swapaxes(xq, 1, 2) + lam * np.eye(xq.shape[1])
            sol = self.wb + np.swapaxes(xq, 1, 2) @ spd.solve(k, (xf - xq) @ self.wb)
        else:
            power = np.diagonal(self.qq, axis1=1, axis2=2)[:, :-1].mean(axis=1)
            lam = ridge * np.maximum(power, 1e-30)[:, None, None]
            sol = spd.solve(self.qq + lam * np.eye(d1), self.qf @ self.wb + lam * self.wb)    # [g, d + 1, O/g]
        sol = np.swapaxes(sol, 1, 2)
        return sol[:, :, :-1].reshape(self.shape), sol[:, :, -1].reshape(-1)

    @property
    def determined(self) -> bool:
        """Whether the samples gave at least as many input rows as a channel has weights (its
        bias included): fewer, and the inputs' covariance is singular, so GPTQ's error feedback
        would run on its damping alone (a squeeze-excitation conv reads one pooled row an image;
        a deep 3x3 conv a few)."""
        return self.rows >= self.qq.shape[1]

    def rounded(self, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(weights on the lowering's per-channel INT8 grid, bias) for the fit `w`, `b`: each
        channel rounded one input column at a time with the error fed back through the INT8
        inputs' covariance (GPTQ, `tftpu.quant.weight_rounding.gptq`), the bias taking back the
        rounding's mean (the inputs' mean times the weights' change). One level of each channel
        stays at +-127, so the lowering derives the same scale and takes these levels as given."""
        g, o = self.group, w.shape[0]
        qq = self.qq / np.maximum(self.qq[:, -1:, -1:], 1.0)      # per row; the last column counts
        mu = qq[:, -1, :-1]                                        # [g, d] the inputs' mean
        cov = qq[:, :-1, :-1] - mu[:, :, None] * mu[:, None, :]
        blocks = np.asarray(w, np.float64).reshape(g, o // g, -1)
        _, scales = P.weights_per_channel(w, 0)
        scales = scales.reshape(g, o // g)
        levels = keep_scale(gptq(blocks, cov, scales), blocks)
        on_grid = levels * scales[:, :, None]
        bias = np.asarray(b, np.float64) + ((blocks - on_grid) @ mu[:, :, None]).reshape(-1)
        return on_grid.reshape(w.shape).astype(w.dtype), bias
