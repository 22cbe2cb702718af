"""How deploy's mixed-precision search, its corrections and the equalization step judge a TPU
model: its outputs (and each part of a concatenated output) against TOP's on a few inputs."""

from __future__ import annotations

import math

from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.transforms.lowering.search import References, judge_runs, output_pairs, worst_figures
from tftpu.utils.spans import span

__all__ = ["Judge"]


class Judge:
    """The mixed-precision search's measure of TPU models against TOP on `held` (the test input
    first, then the samples verify judges on): (worst output or part SQNR over them pooled, an
    image whose output is zero up to rounding weighing by its energy; the same on the test input
    alone). TOP runs once (or not at all, given its `references` on `held`)."""

    def __init__(self, top_model, held: list[dict], references: References | None = None):
        self.model, self.held = top_model, held
        references = (references or References(top_model, held, dumped=0)).of(top_model, held)
        self.parts, self.refs, self.floor = references.parts, references.outputs, references.floor
        self.needed = references.needed
        self.seen: dict[int, tuple] = {}        # id -> (the model, kept alive so the id stays its, figures)

    def _judged(self, tpu) -> tuple[dict, dict]:
        """(pooled, test input alone) figures per output and part of `tpu` (`judge_runs`), run once."""
        if id(tpu) not in self.seen:
            with span("judge", inputs=len(self.held)):
                run = TpuInterpreter(tpu, exact_rows=False)
                runs = [output_pairs(self.model, self.parts, ref, run.run(x, dequantize=True, keep=self.needed))
                        for x, ref in zip(self.held, self.refs)]
                self.seen[id(tpu)] = (tpu, judge_runs(runs, self.floor), judge_runs(runs[:1], self.floor))
        return self.seen[id(tpu)][1:]

    def float_run(self, variant) -> tuple[float, float]:
        """(pooled, test input alone) worst SQNR of `variant`, the TOP model judged with other
        weights (`tftpu.quant.bias_correction.lowered_weights`), run in float."""
        run = TopInterpreter(variant)
        runs = [output_pairs(self.model, self.parts, ref, run.run(x, keep=self.needed))
                for x, ref in zip(self.held, self.refs)]
        figures = (worst_figures(judge_runs(runs, self.floor))[1], worst_figures(judge_runs(runs[:1], self.floor))[1])
        return tuple(-math.inf if math.isnan(v) else v for v in figures)

    def __call__(self, tpu) -> tuple[float, float]:
        pooled, alone = self._judged(tpu)
        figures = (worst_figures(pooled)[1], worst_figures(alone)[1])
        return tuple(-math.inf if math.isnan(v) else v for v in figures)

    def worst(self, tpu, judge_first: bool) -> tuple[float, float]:
        """The worst (cosine, SQNR) of `tpu` as the mixed-precision search judges a program on
        the same inputs (`judge_runs(..., judge_first)`: each part the worse of pooled and the
        first input alone)."""
        pooled, alone = self._judged(tpu)
        if judge_first and len(self.held) > 1:
            pooled = {**pooled, **{n: tuple(map(min, a, pooled.get(n, a))) for n, a in alone.items()}}
        return worst_figures(pooled)

    @property
    def where(self) -> str:
        n = len(self.held) - 1
        return "the test input" + (f" and {n} sample{'s' if n > 1 else ''}" if n else "")
