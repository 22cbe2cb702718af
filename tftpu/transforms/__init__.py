"""tftpu.transforms: passes over TOP (and later TPU) modules.

>>> from tftpu.transforms import canonicalize
>>> report = canonicalize(model)  # doctest: +SKIP
"""

from tftpu.transforms.canonicalize import PATTERNS, Report, canonicalize

__all__ = ["PATTERNS", "Report", "canonicalize"]
