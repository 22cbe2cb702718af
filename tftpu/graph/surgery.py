"""Editing helpers over a TensorFlow GraphDef, in the spirit of onnx-graphsurgeon.

A `GraphEditor` indexes nodes by name and their consumers, adds nodes, rewires uses, splices in
subgraphs written with ordinary TF ops (`splice`), and removes dead nodes.

>>> ed = GraphEditor(graph_def)                        # doctest: +SKIP
>>> [y] = ed.splice(lambda x: tf.nn.relu(x), ["conv:0"], prefix="conv/relu")  # doctest: +SKIP
>>> ed.replace_uses("conv:0", y, exclude={"conv/relu/Relu"})                 # doctest: +SKIP
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Mapping, Sequence

from tftpu.errors import ShapeError
from tftpu.utils.names import unique_name


def parse(tensor: str) -> tuple[str, int]:
    """'node:1' -> ('node', 1); 'node' -> ('node', 0); '^node' -> ('node', -1) (control)."""
    if tensor.startswith("^"):
        return tensor[1:], -1
    name, sep, idx = tensor.rpartition(":")
    if sep and idx.isdigit():
        return name, int(idx)
    return tensor, 0


def ref(node: str, index: int = 0) -> str:
    """The GraphDef spelling of output `index` of `node` ('node' for output 0)."""
    return node if index == 0 else f"{node}:{index}"


def rebind(tensor: str, bound: Mapping[str, str], rename: Callable[[str], str]) -> str:
    """A tensor reference of a spliced-in body as the outer graph spells it: a node in `bound` (a
    placeholder or function argument) becomes the outer tensor bound to it, any other node is
    renamed by `rename`; control edges stay control edges."""
    name, idx = parse(tensor)
    if name in bound:
        return "^" + parse(bound[name])[0] if idx < 0 else bound[name]
    new = rename(name)
    return "^" + new if idx < 0 else ref(new, idx)


def canonical(tensor: str) -> str:
    """'node:0' and 'node' -> 'node'; other outputs unchanged."""
    name, idx = parse(tensor)
    return "^" + name if idx < 0 else ref(name, idx)


class GraphEditor:
    """A mutable GraphDef (library included) with name and consumer indexes."""

    def __init__(self, graph_def):
        import tensorflow as tf

        self.graph_def = tf.compat.v1.GraphDef()
        self.graph_def.CopyFrom(graph_def)
        self._consumers = None
        self._names = None

    # --- lookups -------------------------------------------------------------------------
    @property
    def nodes(self):
        return self.graph_def.node

    def node(self, name: str):
        """The NodeDef called `name` (KeyError if absent)."""
        return self._by_name()[parse(name)[0]]

    def has(self, name: str) -> bool:
        return parse(name)[0] in self._by_name()

    def _by_name(self):
        if self._names is None:
            self._names = {n.name: n for n in self.graph_def.node}
        return self._names

    def _index(self):
        if self._consumers is None:
            index = collections.defaultdict(list)
            for n in self.graph_def.node:
                for i, inp in enumerate(n.input):
                    if not inp.startswith("^"):
                        index[canonical(inp)].append((n, i))
            self._consumers = index
        return self._consumers

    def _link(self, node, i: int, tensor: str):
        if self._consumers is not None and not tensor.startswith("^"):
            self._consumers[canonical(tensor)].append((node, i))

    def _unlink(self, node, i: int, tensor: str):
        if self._consumers is not None and not tensor.startswith("^"):
            uses = self._consumers.get(canonical(tensor), [])
            uses[:] = [(n, j) for n, j in uses if not (n.name == node.name and j == i)]

    def consumers(self, tensor: str) -> list[tuple[object, int]]:
        """(node, input index) for each data use of `tensor`."""
        return list(self._index().get(canonical(tensor), ()))

    def control_consumers(self, node_name: str) -> list:
        """Nodes holding a control edge from `node_name`."""
        return [n for n in self.graph_def.node if "^" + node_name in n.input]

    def output_shape(self, tensor: str):
        """Static shape (list, None for unknown dims) from `_output_shapes`, or None if unknown."""
        name, idx = parse(tensor)
        node = self.node(name)
        shapes = node.attr["_output_shapes"].list.shape if "_output_shapes" in node.attr else []
        if idx >= len(shapes) or shapes[idx].unknown_rank:
            return None
        return [d.size if d.size >= 0 else None for d in shapes[idx].dim]

    def const_value(self, tensor: str):
        """numpy value of a Const (through Identity), or None."""
        import tensorflow as tf

        name, _ = parse(tensor)
        node = self.node(name)
        while node.op == "Identity" and node.input:
            node = self.node(parse(node.input[0])[0])
        if node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor)

    def unique_name(self, base: str) -> str:
        """`base`, or `base_<i>` with the smallest i >= 1 that no node is named yet."""
        return unique_name(base, self._by_name())

    # --- edits ---------------------------------------------------------------------------
    def _added(self, node):
        if self._names is not None:
            self._names[node.name] = node
        for i, inp in enumerate(node.input):
            self._link(node, i, inp)

    def add_node(self, op: str, name: str, inputs: Sequence[str] = (), attrs: dict | None = None,
                 device: str = ""):
        """Append a node (name made unique) and return it."""
        node = self.graph_def.node.add()
        node.op = op
        node.name = self.unique_name(name)
        node.input.extend(inputs)
        node.device = device
        for key, value in (attrs or {}).items():
            node.attr[key].CopyFrom(value)
        self._added(node)
        return node

    def set_input(self, node, index: int, tensor: str) -> None:
        self._unlink(node, index, node.input[index])
        node.input[index] = tensor
        self._link(node, index, tensor)

    def replace_uses(self, old: str, new: str, exclude: Iterable[str] = ()) -> int:
        """Point every data use of tensor `old` at `new` (except in nodes named in `exclude`)."""
        exclude = set(exclude)
        count = 0
        for node, i in self.consumers(old):
            if node.name not in exclude:
                self.set_input(node, i, new)
                count += 1
        return count

    def remove(self, names: Iterable[str]) -> None:
        """Delete nodes; control edges to them are dropped (their data uses must be gone)."""
        names = set(names)
        nodes = self.graph_def.node
        for i in reversed(range(len(nodes))):
            if nodes[i].name in names:
                for j, inp in enumerate(nodes[i].input):
                    self._unlink(nodes[i], j, inp)
                if self._names is not None:
                    self._names.pop(nodes[i].name, None)
                del nodes[i]  # in place: NodeDef references held elsewhere stay valid
        for n in nodes:
            if any(i.startswith("^") and i[1:] in names for i in n.input):
                keep = [i for i in n.input if not (i.startswith("^") and i[1:] in names)]
                del n.input[:]
                n.input.extend(keep)

    def remove_dead(self, candidates: Iterable[str], protected: Iterable[str] = ()) -> list[str]:
        """Remove candidate nodes (and, transitively, their inputs among the candidates) that
        nothing uses any more, by data or control edge; stateful ops are never candidates."""
        candidates = [c for c in candidates if self.has(c)]
        protected = set(protected)
        used = collections.Counter(parse(inp)[0] for n in self.graph_def.node for inp in n.input)
        removed = []
        changed = True
        while changed:
            changed = False
            for name in candidates:
                if name in removed or used[name] or name in protected:
                    continue
                node = self.node(name)
                if _is_stateful(node.op):
                    continue
                for inp in node.input:
                    used[parse(inp)[0]] -= 1
                removed.append(name)
                changed = True
        self.remove(removed)
        return removed

    def splice(self, fn: Callable, inputs: Sequence[str], prefix: str, device: str = "",
               dtypes: Sequence | None = None, shapes: Sequence | None = None) -> list[str]:
        """Insert the ops `fn(*placeholders)` builds, fed by the tensors `inputs`.

        `fn` uses ordinary TF ops; its nodes are copied in under `prefix` on `device` and the
        names of the tensors it returns (one or a list) are returned.
        """
        import tensorflow as tf

        g = tf.Graph()
        with g.as_default():
            phs = []
            for i, t in enumerate(inputs):
                dtype = dtypes[i] if dtypes else self.output_dtype(t)
                shape = shapes[i] if shapes else self.output_shape(t)
                phs.append(tf.compat.v1.placeholder(dtype, shape, name=f"splice_in_{i}"))
            outs = fn(*phs)
        single = not isinstance(outs, (list, tuple))
        outs = [outs] if single else list(outs)
        sub = g.as_graph_def(add_shapes=True)
        ph_map = {f"splice_in_{i}": t for i, t in enumerate(inputs)}
        existing = self._by_name()
        rename = {}
        for n in sub.node:
            if n.name in ph_map:
                continue
            new = f"{prefix}/{n.name}"
            k = 1
            while new in existing:
                new = f"{prefix}_{k}/{n.name}"
                k += 1
            rename[n.name] = new

        def remap(tensor: str) -> str:
            return rebind(tensor, ph_map, rename.__getitem__)

        for n in sub.node:
            if n.name in ph_map:
                continue
            new = self.graph_def.node.add()
            new.CopyFrom(n)
            new.name = rename[n.name]
            del new.input[:]
            new.input.extend(remap(i) for i in n.input)
            new.device = device
            self._added(new)
        result = []
        for t in outs:
            name = t.op.name
            result.append(ph_map[name] if name in ph_map else ref(rename[name], t.value_index))
        return result

    def output_dtype(self, tensor: str):
        """DType of a node output, from the op's registered signature and the node's attrs."""
        import tensorflow as tf
        from tensorflow.python.framework import op_def_registry

        name, idx = parse(tensor)
        node = self.node(name)
        op_def = op_def_registry.get(node.op)
        if op_def is None:
            raise ShapeError(f"{name}: unknown op {node.op}")
        flat = []
        for arg in op_def.output_arg:
            if arg.number_attr:
                count = node.attr[arg.number_attr].i
            else:
                count = 1
            if arg.type_list_attr:
                flat.extend(tf.dtypes.as_dtype(t) for t in node.attr[arg.type_list_attr].list.type)
            elif arg.type_attr:
                flat.extend([tf.dtypes.as_dtype(node.attr[arg.type_attr].type)] * count)
            else:
                flat.extend([tf.dtypes.as_dtype(arg.type)] * count)
        return flat[idx]


_STATEFUL_PREFIXES = ("Assign", "Resource", "Iterator", "MultiDeviceIterator", "Collective", "Var",
                      "Stateful", "Random", "Save", "Restore", "Print", "Send", "Recv", "NoOp")


def _is_stateful(op: str) -> bool:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op)
    if op_def is not None and op_def.is_stateful:
        return True
    return op.startswith(_STATEFUL_PREFIXES) or op == "Placeholder"
