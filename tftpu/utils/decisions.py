"""What a pass decided, and why: shared by the TF graph passes and the TOP / TPU module passes.

A pass records, per candidate it looked at, whether it applied a rewrite or declined, the
reason, and the numbers behind it, so a user can read why (e.g. "conv0: declined: stride 1").
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Decision:
    """One candidate a pass looked at: applied or declined, why, and the numbers behind it."""

    where: str
    applied: bool
    reason: str
    numbers: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        mark = "applied" if self.applied else "declined"
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in self.numbers.items())
        return f"{self.where}: {mark}: {self.reason}" + (f" [{nums}]" if nums else "")


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@dataclasses.dataclass
class PassResult:
    """What one pass did: its decisions, in the order it made them."""

    name: str
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    disabled: bool = False
    detail: object = dataclasses.field(default=None, repr=False, compare=False)  # the pass's own report

    @property
    def changed(self) -> list[Decision]:
        return [d for d in self.decisions if d.applied]

    @property
    def declined(self) -> list[Decision]:
        return [d for d in self.decisions if not d.applied]

    def apply(self, where: str, reason: str, **numbers) -> Decision:
        d = Decision(where, True, reason, numbers)
        self.decisions.append(d)
        return d

    def decline(self, where: str, reason: str, **numbers) -> Decision:
        d = Decision(where, False, reason, numbers)
        self.decisions.append(d)
        return d

    def __str__(self):
        if self.disabled:
            return f"{self.name}: disabled"
        head = f"{self.name}: {len(self.changed)} rewrite(s), {len(self.declined)} declined ({self.seconds:.3f} s)"
        return "\n".join([head] + [f"  {d}" for d in self.decisions])


