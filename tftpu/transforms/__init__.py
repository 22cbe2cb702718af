"""tftpu.transforms: passes over TOP (and later TPU) modules, one module per pass.

>>> from tftpu.transforms.canonicalize import canonicalize
>>> report = canonicalize(model)  # doctest: +SKIP
"""
