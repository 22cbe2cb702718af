"""`tftpu.optimize`: run tftpu's graph passes over a tf.function and call the result like it.

>>> step = tftpu.optimize(train_step, iterator, target="tpu")    # doctest: +SKIP
>>> loss = step(iterator)          # trains the original variables
>>> print(step.report)             # each pass's decisions, with the numbers behind them
"""

from __future__ import annotations

from typing import Sequence

from tftpu.graph.capture import Captured, capture
from tftpu.graph.pass_manager import GraphContext, PassManager, Report
from tftpu.graph.reimport import pack_outputs, register, reimport
from tftpu.graph.surgery import GraphEditor


def default_passes(pass_options: dict | None = None) -> list:
    """The passes `optimize` runs, in order."""
    import inspect

    from tftpu.errors import UsageError
    from tftpu.passes.space_to_depth import SpaceToDepthPass

    passes = {SpaceToDepthPass.name: SpaceToDepthPass}
    if pass_options is not None and not isinstance(pass_options, dict):
        raise UsageError(f"pass_options {pass_options!r}: expected a dict of pass name -> dict of options")
    opts = dict(pass_options or {})
    for name, given in opts.items():
        if name not in passes:
            raise UsageError(f"pass_options names {name!r}: the passes are {', '.join(passes)}")
        known = list(inspect.signature(passes[name]).parameters)
        if not isinstance(given, dict) or set(given) - set(known):
            raise UsageError(f"pass_options[{name!r}] {given!r}: expected a dict of its options ({', '.join(known)})")
    return [SpaceToDepthPass(**opts.get("space_to_depth", {}))]


class OptimizedFunction:
    """The rewritten function: called like the original, bound to the same variables."""

    def __init__(self, captured: Captured, graph_def, report: Report):
        self.captured = captured
        self.graph_def = graph_def
        self.report = report
        try:
            self._name = register(graph_def, captured)
        except (AttributeError, TypeError):  # private runtime API moved: use the traced path
            self._name = None
        self._concrete = None

    @property
    def concrete_function(self):
        """The rewritten graph as a ConcreteFunction over the flat arguments (for use inside
        tf.function and for SavedModel export); built on first use."""
        if self._concrete is None:
            self._concrete = reimport(self.graph_def, self.captured)
        return self._concrete

    def __call__(self, *args, **kwargs):
        from tensorflow.python.eager import context, record

        flat = self.captured.flat_args(args, kwargs)
        ctx = context.context()
        # the runtime-function fast path is not seen by a recording GradientTape
        if self._name and ctx.executing_eagerly() and not record.could_possibly_record():
            outs = ctx.call_function(self._name, list(flat) + list(self.captured.captures),
                                     len(self.captured.output_names))
        else:
            outs = self.concrete_function(*flat)
        return pack_outputs(self.captured, outs)

    def __repr__(self):
        return f"<OptimizedFunction {self.captured.concrete.name}: {len(self.graph_def.node)} nodes>"


def optimize(fn, *args, target="tpu", disable: Sequence[str] = (), pass_options: dict | None = None,
             **kwargs) -> OptimizedFunction:
    """Capture `fn` (tf.function called with `args`/`kwargs`, or a ConcreteFunction), run the
    passes for `target` (a chip in tftpu/configs/chips, or a chip yaml path) except those in `disable`,
    and return the re-imported function with `.report` and `.graph_def`.

    `pass_options` maps a pass name to its options, e.g. `{"space_to_depth": {"block_size": 4}}`.
    """
    from tftpu.passes.cost import Target

    cap = capture(fn, *args, **kwargs)
    editor = GraphEditor(cap.graph_def)
    ctx = GraphContext(editor, list(cap.arg_names), Target.load(target))
    report = PassManager(default_passes(pass_options), disable).run(ctx)
    return OptimizedFunction(cap, editor.graph_def, report)
