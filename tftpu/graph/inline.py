"""Inline function calls (PartitionedCall / StatefulPartitionedCall / direct calls) of a GraphDef.

SavedModel signatures and nested tf.functions keep their bodies in the function library; passes
look for patterns across the whole step, so calls are inlined first (recursively). Each body is
rebuilt with shape inference for the call's input shapes, so `_output_shapes` stay available.
A NoOp named like the call keeps `^call` control edges meaningful.
"""

from __future__ import annotations

from tftpu.graph.surgery import GraphEditor, parse, rebind, ref

CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
MAX_ROUNDS = 16


def _callee(node, library: dict):
    if node.op in CALL_OPS:
        name = node.attr["f"].func.name
        return library.get(name)
    return library.get(node.op)


def inline_calls(graph_def):
    """A copy of `graph_def` with every call of a library function replaced by its body."""
    library = {f.signature.name: f for f in graph_def.library.function}
    if not library:
        return graph_def
    ed = GraphEditor(graph_def)
    for _ in range(MAX_ROUNDS):
        calls = [n for n in ed.nodes if _callee(n, library) is not None]
        if not calls:
            break
        for call in calls:
            _inline_one(ed, call, library[_callee(call, library).signature.name])
    return prune_library(ed.graph_def)


def _inline_one(ed: GraphEditor, call, fdef) -> None:
    import tensorflow as tf
    from tensorflow.python.framework import function_def_to_graph

    data_inputs = [i for i in call.input if not i.startswith("^")]
    control_inputs = [i for i in call.input if i.startswith("^")]
    shapes = []
    for t in data_inputs:
        shape = ed.output_shape(t)
        shapes.append(None if shape is None else tf.TensorShape(shape))
    with tf.Graph().as_default():
        fg = function_def_to_graph.function_def_to_graph(fdef, input_shapes=shapes,
                                                          include_library_functions=True)
        body = fg.as_graph_def(add_shapes=True)
        arg_names = [t.op.name for t in fg.inputs]
        outputs = [ref(t.op.name, t.value_index) for t in fg.outputs]
        control_outputs = [op.name for op in fg.control_outputs]
    prefix = call.name
    call_name, call_device = call.name, call.device
    args = dict(zip(arg_names, data_inputs))
    body_names = {n.name for n in body.node if n.name not in args}

    def remap(t: str) -> str:
        return rebind(t, args, lambda name: f"{prefix}/{name}")

    ed.remove([call_name])
    added = []
    for n in body.node:
        if n.name not in body_names:
            continue
        inputs = [remap(i) for i in n.input]
        if not any(parse(i)[0] in body_names for i in n.input):
            inputs += control_inputs
        new = ed.add_node(n.op, f"{prefix}/{n.name}", inputs, dict(n.attr.items()),
                          n.device or call_device)
        if new.name != f"{prefix}/{n.name}":
            raise ValueError(f"inlining {call_name}: name clash on {prefix}/{n.name}")
        if "_class" in new.attr:
            locs = [c.decode() for c in new.attr["_class"].list.s]
            new.attr["_class"].list.s[:] = [
                (f"loc:@{prefix}/{c[5:]}" if c.startswith("loc:@") and c[5:] in body_names else c).encode()
                for c in locs]
        added.append(new.name)
    n_out = len(outputs)
    for j in range(n_out):
        target = remap(outputs[j])
        ed.replace_uses(ref(call_name, j), target)
    # `^call` still means "after the whole call": a NoOp with the call's name.
    keep = [remap(o) for o in outputs] + [f"{prefix}/{c}" for c in control_outputs]
    ed.add_node("NoOp", call_name, ["^" + parse(k)[0] for k in keep], device=call_device)


def _referenced(nodes, library: dict) -> set:
    names = set()
    for n in nodes:
        if n.op in library:
            names.add(n.op)
        for value in n.attr.values():
            if value.HasField("func"):
                names.add(value.func.name)
            names.update(f.name for f in value.list.func)
    return names & set(library)


def prune_library(graph_def):
    """Drop library functions that no node (of the graph or of a kept function) refers to."""
    library = {f.signature.name: f for f in graph_def.library.function}
    keep = set()
    todo = _referenced(graph_def.node, library)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        todo |= _referenced(library[name].node_def, library) - keep
    if len(keep) == len(library):
        return graph_def
    kept = [library[n] for n in sorted(keep)]
    gradients = [g for g in graph_def.library.gradient if g.function_name in keep]
    del graph_def.library.function[:]
    graph_def.library.function.extend(kept)
    del graph_def.library.gradient[:]
    graph_def.library.gradient.extend(gradients)
    return graph_def
