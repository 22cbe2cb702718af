"""Arguments that take one of a few values (True / False, or "auto" too), checked by name before
any work: a string such as "no" is truthy, and would otherwise switch a step on silently."""

from __future__ import annotations

from tftpu.errors import UsageError

BOOL = (True, False)
AUTO = (True, False, "auto")


def check_choices(allowed: tuple = BOOL, **given) -> None:
    """A UsageError naming the first of `given` (argument name -> value) whose value is not one of
    `allowed` (compared by identity for True / False, so 1 and 0 are not taken for them)."""
    for name, value in given.items():
        if not any(value is a if isinstance(a, bool) else value == a for a in allowed):
            shown = ", ".join(repr(a) for a in allowed)
            raise UsageError(f"{name}={value!r}: expected one of {shown}")
