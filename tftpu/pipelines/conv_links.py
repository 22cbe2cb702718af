"""Which tensors deploy's INT8 program reads on 16 bits, priced in estimated latency: the model
input where its convs' two INT8 passes cost little (`input_links`), and the dense convs whose
8-bit input adds the most noise per extra cycle, as many as a latency limit allows
(`rank_conv_links`, `ConvLinks.within`). `tftpu.pipelines.deploy` weighs them against the
float ops and builds the program with the links taken."""

from __future__ import annotations

import dataclasses

from tftpu.quant.links import InputConvs, input_convs

__all__ = ["CONV_LINKS_LATENCY", "INPUT_LINKS_LATENCY", "INPUT_LINKS_GAIN", "INPUT_LINKS_GAP", "LINK_EFFECT_WORK",
           "input_links", "rank_conv_links", "ConvLinks", "program_profile"]

# under wide_links="auto", dense convs read 16-bit links while the program stays within this much
# latency of the one with 8-bit conv inputs
CONV_LINKS_LATENCY = 1.10
# the convs reading a model input read it on 16 bits where that keeps the all-INT8 program's
# estimated latency within this multiple (a stem of few channels on a large image pays little)
INPUT_LINKS_LATENCY = 1.03
# ... or up to the float ops' latency budget where all INT8 misses the target and they lift it this many dB
INPUT_LINKS_GAIN = 1.0
# ... and, before a mixed-precision search, only where all INT8 misses the target by more than this
INPUT_LINKS_GAP = 8.0


def input_links(top_model, chip, table, qtable, asymmetric, float_tail: bool, budget: float, judge, need: float,
                searching: bool = False):
    """(links, note, latency with an 8-bit input, latency with the links, the all-INT8 lowering with
    the links taken or None): `InputConvs` of the convs reading a model input where their 16-bit
    reads (two INT8 passes) keep the all-INT8 program's estimated latency within
    `INPUT_LINKS_LATENCY`; or within `budget` where all INT8 misses `need` dB by `judge` and they
    lift it by `INPUT_LINKS_GAIN` dB, with the interpolated tables or without (a detector whose
    output turns on the image's least differences: PP-OCRv4's text map), and, where a
    mixed-precision search follows (`searching`), misses it by more than `INPUT_LINKS_GAP` dB (a
    gap nearer the target the float ops close better with that latency: PP-OCRv6's text
    detector, all INT8 14.6 -> 19.5 dB so, reached 19.8 dB finally, 20.1 without); else True."""
    from tftpu.transforms.lowering import lower
    from tftpu.transforms.lowering.lower import TWO_PASSES

    names = input_convs(top_model)
    none = True, None, None, None, None
    if not names:
        return none
    built = {links: lower(top_model, chip, "INT8", table, qtable=qtable, asymmetric=asymmetric, wide_links=links,
                          float_tail=float_tail) for links in (True, InputConvs(names))}
    taken = {d.name for d in built[InputConvs(names)][1].decisions if d.reason == TWO_PASSES} & names
    if not taken:                               # (a conv kept in float, or one that cannot read them)
        return none[:4] + (built[True],)
    us = {k: program_profile(m, chip).latency_us for k, (m, _) in built.items()}
    ratio = us[InputConvs(names)] / max(us[True], 1e-9)
    why = f"limit {INPUT_LINKS_LATENCY:.2f}x"
    if ratio > INPUT_LINKS_LATENCY:
        if judge is None or ratio > budget:
            return none[:4] + (built[True],)
        eight, wide = min(judge(built[True][0])), min(judge(built[InputConvs(names)][0]))
        near = need - (INPUT_LINKS_GAP if searching else 0.0)       # (all INT8 at or above: 8 bits)
        if eight >= near:
            return none[:4] + (built[True],)
        with_tables = ""
        if wide < eight + INPUT_LINKS_GAIN:     # (measured: PP-OCRv4's input counts only once its tables interpolate)
            tabled = [min(judge(lower(top_model, chip, "INT8", table, qtable=qtable, asymmetric=asymmetric,
                                      wide_links=links, float_tail=float_tail)[0]))
                      for links in ("tables", frozenset(names))]
            if tabled[1] < tabled[0] + INPUT_LINKS_GAIN or tabled[0] >= near:
                return none[:4] + (built[True],)
            (eight, wide), with_tables = tabled, " with interpolated tables"
        why = (f"all INT8{with_tables} {eight:.1f} -> {wide:.1f} dB, below the {need:g} dB target, within the "
               f"{budget:.2f}x latency budget")
    note = (f"the model input read on 16 bits by {len(taken)} conv{'s' if len(taken) > 1 else ''} "
            f"(two INT8 passes): estimated latency {ratio:.3f}x the 8-bit input's ({why})")
    return InputConvs(taken), note, us[True], us[InputConvs(names)], built[InputConvs(names)]


# the conv links are ranked by their inputs' noise carried to the outputs where that costs at
# most this many FLOPs (each conv's rerun of the ops after it, on the test input), else by the
# noise at each conv's output. Measured (`benchmarks/detectors.py`, held-out photo, worst part,
# default / pure INT8): face full range 21.6 / 22.3 -> 26.2 / 24.4 dB, palm lite 20.7 / 18.4 ->
# 20.9 / 19.7, palm full 17.6 / 13.7 -> 18.0 / 14.6, pose 22.9 / 17.0 -> 26.0 / 17.7, YOLOv8n
# 29.2 / 27.2 -> 27.7 / 27.7 (5-58 GFLOP); PP-OCRv6's text detector
# (250 GFLOP) 20.3 / 19.4 -> 21.4 / 18.3, but its calibration and search 40 -> 72 s (beside a CI
# run), past the 60 s a 640x640 detector's may take
LINK_EFFECT_WORK = 1e11


def rank_conv_links(top_model, chip, table, qtable, asymmetric, float_tail: bool, sample: dict,
                    plain: tuple, dump: dict | None = None, base=True) -> "ConvLinks | None":
    """The dense convs that may read their data on 16 bits (two INT8 passes; with the
    interpolated tables), the most noise spared per cycle first (the noise each conv's 8-bit
    input alone adds at the outputs on `sample`, `search.input_rounding_effects`, or where
    carrying it there costs more than `LINK_EFFECT_WORK`, at the conv's own output,
    `tftpu.quant.links.input_rounding_noise`; over the conv's own extra cycles in the program with
    every conv so), priced against the all-INT8 program with the default links `base` (`plain`:
    that lowering, done); None where no conv gains them. A conv that waits on DDR pays little for
    it; one that keeps the matrix unit busy runs at half speed. `dump`: TOP's every tensor on
    `sample`, where already run."""
    from tftpu.backend.cycles import estimate
    from tftpu.quant.links import input_rounding_noise
    from tftpu.transforms.lowering.lower import TWO_PASSES
    from tftpu.transforms.lowering.search import carrying_work, input_rounding_effects

    def two_passes(report) -> set:
        return {d.name for d in report.decisions if d.reason == TWO_PASSES}

    offer = ConvLinks(top_model, chip, table, qtable, asymmetric, float_tail,
                      frozenset() if base is True else frozenset(base), base)
    (base_model, base_report), (every, every_report) = plain, offer.build("convs")
    convs = two_passes(every_report) - two_passes(base_report)
    if not convs:
        return None
    extra: dict[str, int] = dict.fromkeys(convs, 0)
    before = {o.name: o.cycles for o in estimate(base_model, chip).ops}
    for o in estimate(every, chip).ops:        # a conv writing a model output is renamed <name>_<dtype>
        name = o.name if o.name in extra else o.name.rsplit("_", 1)[0]
        if name in extra and o.type == "tpu.Conv":
            extra[name] += o.cycles - before.get(o.name, 0)
    if carrying_work(top_model, convs, samples=1) <= LINK_EFFECT_WORK:
        noise, offer.spared = input_rounding_effects(top_model, table, asymmetric, sample, convs, dump), "at the outputs"
    else:
        noise, offer.spared = input_rounding_noise(top_model, table, asymmetric, sample, convs, dump), "at the conv"
    offer.order = sorted(convs, key=lambda n: (-noise.get(n, 0.0) / max(extra[n], 1), extra[n], n))
    offer.us = {0: program_profile(base_model, chip).latency_us, len(offer.order): program_profile(every, chip).latency_us}
    return offer


@dataclasses.dataclass
class ConvLinks:
    """`rank_conv_links`' ranking of the dense convs, each priced once: `within(limit)` takes its longest
    prefix that keeps the all-INT8 program within `limit` times the latency with 8-bit conv inputs."""

    top_model: object
    chip: object
    table: object
    qtable: object
    asymmetric: object
    float_tail: bool
    stems: frozenset          # the model input's convs, read wide already
    base: object              # the default links (True, or the stems' InputConvs)
    order: list = dataclasses.field(default_factory=list)
    spared: str = ""
    us: dict = dataclasses.field(default_factory=dict)     # prefix length -> estimated latency

    def build(self, links):
        from tftpu.transforms.lowering import lower
        return lower(self.top_model, self.chip, "INT8", self.table, qtable=self.qtable, asymmetric=self.asymmetric,
                     wide_links=links, float_tail=self.float_tail)

    def latency(self, k: int) -> float:
        if k not in self.us:
            self.us[k] = program_profile(self.build(frozenset(self.order[:k]) | self.stems)[0], self.chip).latency_us
        return self.us[k]

    def within(self, limit: float) -> tuple:
        """(links, note, latency with 8-bit conv inputs, latency with the links) for `limit`."""
        us, order = self.us, self.order
        most = us[0] * limit
        lo, hi = 0, len(order)                  # the most convs that fit: latency(lo) fits
        if self.latency(hi) <= most:
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.latency(mid) <= most else (lo, mid)
        if lo == 0:                             # (the bisection has priced the first alone)
            return self.base, (f"no dense conv reads 16 bits: the first of {len(order)} in the order (the most "
                               f"noise spared {self.spared} per cycle) alone takes the estimated latency to "
                               f"{self.latency(1):,.1f} us against {us[0]:,.1f} us "
                               f"({self.latency(1) / max(us[0], 1e-9):.2f}x; limit {limit:.2f}x)"), us[0], us[0]
        links, at = ("convs" if lo == len(order) else frozenset(order[:lo]) | self.stems), self.latency(lo)
        return links, (f"16-bit inputs to {lo} of {len(order)} dense convs (two INT8 passes; "
                       f"the most noise spared {self.spared} per cycle first): "
                       f"estimated latency {at:,.1f} us against {us[0]:,.1f} us "
                       f"({at / max(us[0], 1e-9):.2f}x; limit {limit:.2f}x)"), us[0], at


def program_profile(tpu_model, chip):
    """The estimated performance of `tpu_model` as the program codegen makes of it (layer groups,
    DMA overlapped with compute): what the report and the .tpumodel give as its latency."""
    from tftpu.backend.codegen import generate
    from tftpu.backend.profile import profile
    return profile(generate(tpu_model, chip))
