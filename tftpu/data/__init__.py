"""tf.data adapters of tftpu: the host-side space-to-depth input transform.

>>> import tftpu.data
>>> ds = tftpu.data.space_to_depth(ds.batch(32), 2, dtype="float32", scale=1 / 255)  # doctest: +SKIP
"""

from tftpu.data.space_to_depth import IMPLEMENTATIONS, LAYOUTS, native_transform, space_to_depth, transform

__all__ = ["space_to_depth", "transform", "native_transform", "LAYOUTS", "IMPLEMENTATIONS"]
