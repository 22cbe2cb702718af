"""Fresh names: `base`, else `base_1`, `base_2`, ... the first one not taken.

Weights, graph nodes and values made by rewrites need names that never clash with existing ones,
and the same choice every run so outputs stay byte-identical.

>>> unique_name("w", {"w", "w_1"})
'w_2'
"""

from __future__ import annotations

from typing import Container


def unique_name(base: str, taken: Container[str]) -> str:
    """`base` if it is not in `taken`, else `base_<i>` for the smallest i >= 1 that is not."""
    if base not in taken:
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"
