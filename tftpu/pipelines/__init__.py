"""tftpu.pipelines: the jobs that chain the layers below, as users and tools run them.

- `optimize`: TF graph passes over a tf.function (public as `tftpu.optimize`);
- `saved_model`: the same over every signature of a SavedModel (`tftpu-optimize`);
- `transform`: import, canonicalize, convert layout, save and verify (`tftpu-transform`);
- `demo`: the whole pipeline on the bundled default (`tftpu-demo`).
"""
