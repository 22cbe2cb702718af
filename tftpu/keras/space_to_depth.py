"""Rewrite a Keras functional model so that its first convolution runs on space-to-depth input.

`space_to_depth(model, block_size=2)` walks from the image input through per-channel
preprocessing (Rescaling, Normalization, Cast, Activation, Identity) and ZeroPadding to the first
Conv2D/Conv3D, and returns a model whose input is the S2D image `[N, ceil(H/b), ceil(W/b), C*b*b]`
(zero-padded at the end of H and W before blocking, `tftpu.data.space_to_depth` does this on the
host). The preprocessing runs after S2D on a `[N, ceil(H/b), ceil(W/b)*b*b, C]` view, so its
per-channel constants broadcast as if tiled b*b; ZeroPadding is folded into the conv's padding;
the conv becomes `tftpu.keras.layers.Conv2D`, which computes its S2D kernel from the original
`[k, k, C, O]` variable at every call. Every other layer is the original layer object (shared
weights) or, with `share_weights=False`, a copy; checkpoints load both ways.

The rewrite reads Keras 3's functional graph (`_nodes_by_depth`, `_run_through_graph`).
"""

from __future__ import annotations

import math
from typing import Sequence

import keras
import numpy as np
from keras.src.models.functional import Functional as KerasFunctional
from keras.src.ops.function import Function

from tftpu.errors import ShapeError, UnsupportedOpError, UsageError
from tftpu.keras import layers as s2d_layers
from tftpu.passes import s2d_geometry

__all__ = ["space_to_depth", "find_first_conv", "conv_pads", "SpaceToDepthModel"]

_CONVS = {keras.layers.Conv2D: s2d_layers.Conv2D, keras.layers.Conv3D: s2d_layers.Conv3D}
_ZERO_PADS = (keras.layers.ZeroPadding2D, keras.layers.ZeroPadding3D)
_INPUT_LAYOUTS = ("NHWC", "NCHW")


@keras.saving.register_keras_serializable(package="tftpu", name="SpaceToDepthModel")
class SpaceToDepthModel(KerasFunctional):
    """A functional model on S2D input whose TF checkpoints have its original model's layout.

    `tf.train.Checkpoint` addresses layers by position in the functional graph; the rewrite
    adds reshapes and drops ZeroPadding, so for checkpoints this model lists the original
    model's layers, with the S2D conv in place of the original conv.
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        original = self.__dict__.get("_tftpu_checkpoint_operations")
        if save_type == "checkpoint" and original is not None:
            if self.__dict__.get("_tftpu_checkpoint_as_sequential"):
                return {"_functional": original}  # a Sequential reaches its layers this way
            children["_operations"] = original
        return children


@keras.saving.register_keras_serializable(package="tftpu", name="SpaceToDepthFunctional")
class Functional(SpaceToDepthModel):
    """A nested functional model rewritten for S2D input (named so Keras weight paths match)."""


@keras.saving.register_keras_serializable(package="tftpu", name="SpaceToDepthSequential")
class Sequential(SpaceToDepthModel):
    """A nested Sequential model rewritten for S2D input (named so Keras weight paths match)."""


_NESTED = {"Functional": Functional, "Sequential": Sequential}


def _blocks(block_size, rank: int) -> tuple[int, ...]:
    """Per-spatial-axis blocks: an int blocks H and W (not D of a Conv3D)."""
    blocks = s2d_geometry.per_axis(block_size, rank - 2)
    if len(blocks) != rank or any(b < 1 for b in blocks) or max(blocks) < 2:
        raise UsageError(f"block_size {block_size!r}: give an int >= 2 or {rank} positive ints "
                         f"(one per spatial axis) with one >= 2")
    return blocks


def _op_desc(op) -> str:
    return f"{type(op).__name__} '{op.name}'"


def _is_per_channel(op, channels: int) -> str | None:
    """Why `op` is not an elementwise per-channel layer (None when it is one)."""
    if isinstance(op, (keras.layers.Identity, keras.layers.Activation)):
        return None
    if type(op).__name__ == "Cast" and not isinstance(op, keras.layers.Layer):
        return None
    if isinstance(op, keras.layers.Rescaling):
        for name in ("scale", "offset"):
            shape = np.shape(getattr(op, name))
            if math.prod(shape) not in (1, channels) or (shape and shape[-1] != math.prod(shape)):
                return f"its {name} of shape {shape} is not per channel"
        return None
    if isinstance(op, keras.layers.Normalization):
        if tuple(a % 4 for a in op.axis) not in ((), (3,)):
            return f"it normalizes over axis {op.axis}, not the channel axis only"
        return None
    return "it is not per-channel elementwise preprocessing, ZeroPadding or a convolution"


def _keeps_zero(op) -> bool:
    """True when `op` maps 0 to 0 (so ZeroPadding before it can fold into the conv)."""
    if isinstance(op, keras.layers.Identity) or type(op).__name__ == "Cast":
        return True
    if isinstance(op, keras.layers.Rescaling):
        return not np.any(np.asarray(op.offset))
    if isinstance(op, keras.layers.Activation):
        return float(keras.ops.convert_to_numpy(op.activation(np.zeros((1,), np.float32)))[0]) == 0.0
    return False


def _consumers(model) -> dict[int, list]:
    users: dict[int, list] = {}
    for nodes in model._nodes_by_depth.values():
        for node in nodes:
            if node.is_input:
                continue
            for t in node.input_tensors:
                users.setdefault(id(t), []).append(node)
    return users


def find_first_conv(model, image_input):
    """Walk from `image_input` to the first conv: `(preprocessing nodes, zero-pad layers, conv node)`.

    The last node may instead call a nested functional/Sequential model that holds the first conv.

    Raises UnsupportedOpError naming the layer that stops the walk and why.
    """
    users = _consumers(model)
    channels = image_input.shape[-1]
    tensor, chain, pads = image_input, [], []
    where = f"model '{model.name}'"
    while True:
        nodes = users.get(id(tensor), [])
        if len(nodes) != 1:
            got = ", ".join(_op_desc(n.operation) for n in nodes) or "nothing"
            raise UnsupportedOpError(
                [(type(n.operation).__name__, n.operation.name) for n in nodes],
                where=f"{where}: the image must feed one chain of layers to the first conv, "
                      f"but {tensor.name if hasattr(tensor, 'name') else 'a tensor'} feeds {got}")
        node = nodes[0]
        op = node.operation
        if len(node.input_tensors) != 1 or len(node.outputs) != 1:
            raise UnsupportedOpError([(type(op).__name__, op.name)],
                                     where=f"{where}: {_op_desc(op)} takes or gives several tensors")
        if type(op) in _CONVS or (isinstance(op, keras.Model) and (
                hasattr(op, "_nodes_by_depth") or getattr(op, "_functional", None) is not None)):
            return chain, pads, node
        if isinstance(op, keras.layers.Layer) and type(op).__name__ in (
                "Conv1D", "DepthwiseConv2D", "SeparableConv2D", "Conv2DTranspose", "Conv3DTranspose"):
            raise UnsupportedOpError([(type(op).__name__, op.name)],
                                     where=f"{where}: the first convolution must be a Conv2D or Conv3D")
        if isinstance(op, _ZERO_PADS):
            if op.data_format != "channels_last":
                raise UnsupportedOpError([(type(op).__name__, op.name)], where=f"{where}: channels_first padding")
            pads.append(op)
        else:
            reason = _is_per_channel(op, channels)
            if reason:
                raise UnsupportedOpError([(type(op).__name__, op.name)],
                                         where=f"{where}: before the first conv, {_op_desc(op)}: {reason}")
            if pads and not _keeps_zero(op):
                raise UnsupportedOpError(
                    [(type(op).__name__, op.name)],
                    where=f"{where}: {_op_desc(op)} after {_op_desc(pads[-1])} does not keep the padding "
                          f"zero, so the padding cannot move into the S2D conv")
            chain.append(node)
        tensor = node.outputs[0]


def _conv_plan(conv, sizes: Sequence[int], pads_layers, blocks) -> list[tuple[int, int]]:
    """Explicit (begin, end) pads per spatial axis of the original conv, ZeroPadding folded in."""
    where = f"conv {_op_desc(conv)}"
    if conv.data_format != "channels_last":
        raise UnsupportedOpError([(type(conv).__name__, conv.name)], where=f"{where}: channels_first")
    if conv.groups != 1:
        raise UnsupportedOpError([(type(conv).__name__, conv.name)], where=f"{where}: groups={conv.groups}")
    if any(d != 1 for d in conv.dilation_rate):
        raise ShapeError(f"{where}: dilation {tuple(conv.dilation_rate)}; space-to-depth needs dilation 1")
    if getattr(conv, "lora_enabled", False):
        raise UnsupportedOpError([(type(conv).__name__, conv.name)], where=f"{where}: LoRA is enabled")
    for axis, (s, b) in enumerate(zip(conv.strides, blocks)):
        if s % b:
            raise ShapeError(f"{where}: stride {tuple(conv.strides)} is not divisible by block "
                             f"{tuple(blocks)} on spatial axis {axis}")
    return conv_pads(conv, sizes, pads_layers)


def conv_pads(conv, sizes: Sequence[int], pads_layers) -> list[tuple[int, int]]:
    """Explicit (begin, end) pads per spatial axis of a Keras conv over an input of `sizes`: the
    ZeroPadding2D layers before it folded in, then its own SAME padding."""
    pads = [[0, 0] for _ in sizes]
    for zp in pads_layers:
        for axis, (b, e) in enumerate(zp.padding):
            pads[axis][0] += b
            pads[axis][1] += e
    if conv.padding == "same":
        for axis, size in enumerate(sizes):
            b, e = s2d_geometry.same_pads(size + sum(pads[axis]), conv.kernel_size[axis], conv.strides[axis])
            pads[axis][0] += b
            pads[axis][1] += e
    return [tuple(p) for p in pads]


def _pick_input(model, input_name):
    inputs = model.inputs
    if input_name is None:
        if len(inputs) != 1:
            raise UsageError(f"model '{model.name}' has {len(inputs)} inputs "
                             f"({', '.join(t.name for t in inputs)}): pass input_name=")
        return inputs[0]
    for t in inputs:
        if t.name == input_name or t._keras_history[0].name == input_name:
            return t
    raise UsageError(f"model '{model.name}' has no input '{input_name}' "
                     f"(inputs: {', '.join(t.name for t in inputs)})")


def space_to_depth(model, block_size=2, *, share_weights: bool = True, input_name: str | None = None,
                   input_layout: str = "NHWC"):
    """A model equal to `model` that takes space-to-depth input; weights keep their original shapes.

    The S2D input of an `[N, H, W, C]` image is `[N, ceil(H/b), ceil(W/b), C*b*b]`, the image
    zero-padded at the end of H and W to a multiple of b and blocked as `tf.nn.space_to_depth`
    (for Conv3D, `[N, D, ceil(H/b), ceil(W/b), C*b*b]`; a tuple `block_size` blocks D too).
    With `input_layout="NCHW"` the model takes `[N, C*b*b, ceil(H/b), ceil(W/b)]` (the fused host
    layout of `tftpu.data.space_to_depth(..., layout="NCHW")`) and transposes it back first.
    The first conv may sit inside a nested functional/Sequential model (a keras.applications
    backbone), which is rewritten in place.
    `share_weights=True` shares every variable with `model`; False gives the new model copies.
    Keras weight files (`save_weights`/`load_weights`, `.keras`) and `tf.train.Checkpoint`s load
    both ways between the two models.
    Raises UnsupportedOpError / ShapeError with the reason when the model cannot be rewritten.
    """
    if input_layout not in _INPUT_LAYOUTS:
        raise UsageError(f"input_layout {input_layout!r}: expected one of {', '.join(_INPUT_LAYOUTS)}")
    model = _functional(model)
    if not share_weights:
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        model = copy
    return _rewrite(model, block_size, input_name, input_layout, False, SpaceToDepthModel)


def _functional(model):
    if isinstance(model, keras.Sequential) and getattr(model, "_functional", None) is not None:
        model = model._functional
    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth"):
        raise UsageError(f"model '{getattr(model, 'name', model)}': space_to_depth needs a functional or "
                         f"Sequential Keras model with a known input shape (subclassed models have no "
                         f"layer graph; use tftpu.optimize on their training step)")
    return model


def _rewrite(model, block_size, input_name, input_layout, preprocessed: bool, model_cls):
    """The S2D twin of functional `model`; `preprocessed`: elementwise ops ran before its input."""
    image = _pick_input(model, input_name)
    chain, pad_layers, first = find_first_conv(model, image)
    op = first.operation
    sizes = tuple(image.shape[1:-1])
    channels = image.shape[-1]
    if any(s is None for s in sizes) or channels is None:
        raise ShapeError(f"model '{model.name}': input shape {tuple(image.shape)} has unknown dimensions; "
                         f"space-to-depth needs the image size")
    if isinstance(op, keras.Model):
        if pad_layers:
            raise UnsupportedOpError([(type(pad_layers[-1]).__name__, pad_layers[-1].name)],
                                     where=f"model '{model.name}': ZeroPadding before the nested model "
                                           f"'{op.name}' that holds the first conv")
        nested = _functional(op)
        replacement = _rewrite(nested, block_size, None, "NHWC", preprocessed or bool(chain),
                               _NESTED.get(type(op).__name__, SpaceToDepthModel))
        s2d_shape = tuple(replacement.inputs[0].shape[1:])
        blocks_total = s2d_shape[-1] // channels
        name = op.name
    else:
        rank = op.rank
        if len(sizes) != rank:
            raise ShapeError(f"model '{model.name}': input of rank {len(image.shape)} feeds {_op_desc(op)}")
        blocks = _blocks(block_size, rank)
        explicit = _conv_plan(op, sizes, pad_layers, blocks)
        try:
            plans = [s2d_geometry.AxisPlan(s, k, st, b, p)
                     for s, k, st, b, p in zip(sizes, op.kernel_size, op.strides, blocks, explicit)]
        except ShapeError as exc:
            raise ShapeError(f"conv {_op_desc(op)}: {exc}") from None
        s2d_shape = tuple(p.blocked_size for p in plans) + (channels * math.prod(blocks),)
        blocks_total = math.prod(blocks)
        replacement = _CONVS[type(op)](input_size=sizes, block_size=blocks, explicit_padding=explicit,
                                       original_channels=channels,
                                       mask_padding=(preprocessed or bool(chain)) and any(p.size_pad for p in plans),
                                       **op.get_config())
        replacement.share_variables(op)
        name = op.name
    if input_layout == "NCHW" and len(s2d_shape) != 3:
        raise UsageError(f"input_layout='NCHW' needs a 2-D image model, '{model.name}' takes {tuple(image.shape)}")

    image_layer = image._keras_history[0]
    if input_layout == "NCHW":
        new_input = keras.Input(shape=(s2d_shape[-1],) + s2d_shape[:-1], dtype=image.dtype,
                                name=image_layer.name)
        x = keras.layers.Permute((2, 3, 1), name=f"{name}_s2d_nchw_to_nhwc")(new_input)
    else:
        new_input = keras.Input(shape=s2d_shape, dtype=image.dtype, name=image_layer.name)
        x = new_input
    if chain:
        # Per-channel ops see `[N, *blocked, prod(b), C]` flattened to rank 4 / 5 with C last.
        view = s2d_shape[:-2] + (s2d_shape[-2] * blocks_total, channels)
        x = keras.layers.Reshape(view, name=f"{name}_s2d_channels_view")(x)
        for node in chain:
            args, kwargs = node.arguments.fill_in({id(node.input_tensors[0]): x})
            x = node.operation(*args, **kwargs)
        x = keras.layers.Reshape(s2d_shape, name=f"{name}_s2d_blocked_view")(x)
    args, kwargs = first.arguments.fill_in({id(first.input_tensors[0]): x})
    first_out = replacement(*args, **kwargs)

    others = [t for t in model.inputs if t is not image]
    try:
        tail = Function(inputs=[first.outputs[0]] + others, outputs=model.outputs)
    except ValueError as exc:
        raise UnsupportedOpError([(type(op).__name__, op.name)],
                                 where=f"model '{model.name}': the image reaches the outputs other than "
                                       f"through {_op_desc(op)} ({str(exc).splitlines()[0]})") from None
    outputs = tail._run_through_graph([first_out] + others, operation_fn=lambda o: o)
    new_inputs = keras.tree.map_structure(lambda t: new_input if t is image else t, model._inputs_struct)
    result = model_cls(inputs=new_inputs,
                               outputs=keras.tree.pack_sequence_as(model._outputs_struct, keras.tree.flatten(outputs)),
                               name=f"{model.name}_space_to_depth")
    import tensorflow as tf

    # Not tracked (object.__setattr__): only the checkpoint view above uses it.
    operations = tf.__internal__.tracking.wrap([replacement if o is op else o for o in model._operations])
    if model_cls is Sequential:
        holder = tf.__internal__.tracking.AutoTrackable()
        holder._operations = operations
        object.__setattr__(result, "_tftpu_checkpoint_as_sequential", True)
        operations = holder
    object.__setattr__(result, "_tftpu_checkpoint_operations", operations)
    return result
