"""tftpu.passes: TF graph passes run by `tftpu.optimize` and `tftpu-optimize`.

- `space_to_depth.SpaceToDepthPass`: S2D of the first strided conv fed by the input;
- `s2d_geometry`: its index arithmetic (also used by tftpu.keras / tftpu.data);
- `cost.Target`: the S2D cost model's view of a chip (`tftpu.chip`, tftpu/configs/chips/*.yaml).
"""
