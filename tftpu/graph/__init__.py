"""tftpu.graph: Grappler-style passes over tf.function graphs.

- `capture`: tf.function (+ call args) or ConcreteFunction -> GraphDef + library, calls inlined;
- `surgery.GraphEditor`: onnx-graphsurgeon-like GraphDef editing;
- `pass_manager`: `Pass`, `PassManager`, `Report` (what changed, why a pass declined);
- `reimport`: the edited graph as a callable on the original variables and iterators.

The jobs built on it (`tftpu.optimize`, SavedModel conversion) are in `tftpu.pipelines`.
"""
