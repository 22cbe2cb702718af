"""Capture a `tf.function` (with its call arguments) or a ConcreteFunction as a GraphDef.

The GraphDef carries the function library and static shapes (`_output_shapes`); `Captured` also
records which placeholders are the call's arguments and which stand for captured resources
(variables, iterators), so `reimport` can run the edited graph on the *original* objects.

>>> cap = capture(train_step, iterator)          # doctest: +SKIP
>>> cap.arg_names, len(cap.capture_names)        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tftpu.errors import UsageError
from tftpu.graph.inline import inline_calls


@dataclasses.dataclass
class Captured:
    """A traced function as GraphDef plus the wiring needed to call it again."""

    graph_def: Any
    concrete: Any                 # the original ConcreteFunction
    arg_names: list[str]          # tensor names of the flat tensor arguments, in call order
    arg_specs: list[Any]          # tf.TensorSpec of each flat argument
    capture_names: list[str]      # tensor names of the placeholders standing for captures
    captures: list[Any]           # the captured outside tensors (variable / iterator handles)
    output_names: list[str]       # tensor names of the flat tensor outputs
    output_structure: Any         # structured outputs; tensors replaced on re-import
    control_output_names: list[str]  # ops that must run (variable updates, ...)
    python_signature: Any = None  # of the tf.function's Python function (for default values)
    variables: list = dataclasses.field(default_factory=list)  # tf.Variables the graph uses

    def flat_args(self, args, kwargs) -> list:
        """The flat tensor arguments of a call `fn(*args, **kwargs)`, as the concrete function sees them."""
        if self.python_signature is not None:
            bound = self.python_signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args, kwargs = bound.args, bound.kwargs
        return flatten_call(self.concrete, args, kwargs)


def concrete_function(fn, *args, **kwargs):
    """`fn` itself if it is a ConcreteFunction, else its trace for these arguments."""
    if hasattr(fn, "structured_input_signature") and hasattr(fn, "graph"):
        return fn
    if hasattr(fn, "get_concrete_function"):
        try:
            return fn.get_concrete_function(*args, **kwargs)
        except (TypeError, ValueError) as e:   # TF's binding of the arguments, or the trace of the body on them
            first = " ".join(str(e).split())[:300]
            raise UsageError(f"tftpu.optimize cannot trace {getattr(fn, '__name__', 'the function')} with the "
                             f"arguments given ({type(e).__name__}: {first})") from None
    raise UsageError(f"tftpu.optimize needs a tf.function or a ConcreteFunction, got {type(fn).__name__}")


def flatten_call(concrete, args, kwargs) -> list:
    """Flatten call arguments into the concrete function's flat tensor inputs."""
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    bound = function_type_utils.canonicalize_function_inputs(args, kwargs, concrete.function_type)
    flat = concrete.function_type.unpack_inputs(bound)
    out = []
    for v in flat:
        if isinstance(v, tf.Variable):
            v = v.handle
        out.append(v)
    return out


def capture(fn, *args, inline: bool = True, **kwargs) -> Captured:
    """Trace `fn` (a tf.function called with `args`, or a ConcreteFunction) into a `Captured`;
    calls of library functions (SavedModel signatures, nested tf.functions) are inlined."""
    import tensorflow as tf

    cf = concrete_function(fn, *args, **kwargs)
    graph = cf.graph
    graph_def = graph.as_graph_def(add_shapes=True)
    if inline:
        graph_def = inline_calls(graph_def)
    n_captures = len(cf.captured_inputs)
    inputs = list(graph.inputs)
    arg_tensors = inputs[: len(inputs) - n_captures]
    internal = inputs[len(inputs) - n_captures:]
    arg_specs = [tf.TensorSpec(t.shape, t.dtype, name=t.op.name) for t in arg_tensors]
    output_names = [t.name for t in cf.outputs]
    control = sorted(op.name for op in graph.control_outputs)
    return Captured(
        graph_def=graph_def,
        concrete=cf,
        arg_names=[t.name for t in arg_tensors],
        arg_specs=arg_specs,
        capture_names=[t.name for t in internal],
        captures=list(cf.captured_inputs),
        output_names=output_names,
        output_structure=cf.structured_outputs,
        control_output_names=control,
        python_signature=_python_signature(fn),
        variables=list(getattr(graph, "variables", ())),
    )


def _python_signature(fn):
    import inspect

    py = getattr(fn, "python_function", None)
    if py is None:
        return None
    try:
        return inspect.signature(py)
    except (TypeError, ValueError):
        return None
