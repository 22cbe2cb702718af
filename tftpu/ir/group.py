"""`tpu.Group`: a layer group as a region, the way TPU-MLIR's listings show it (paper, Listing 4):
the ops that run on chip back to back sit in the group's body, each with its `group_info`, and
a `tpu.Yield` hands the group's results out.

Modules are kept flat in memory (every pass, interpreter and the backend walk one op list);
`wrap` makes the grouped form for the `.tpu.mlir` text (`TpuModel.file_text`), and `unwrap`
flattens it again when a file is read, so text -> module -> text is the identity either way.
"""

from __future__ import annotations

from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr
from xdsl.ir import Block, Region
from xdsl.irdl import IRDLOperation, irdl_op_definition, opt_attr_def, region_def, traits_def, var_operand_def, \
    var_result_def
from xdsl.traits import IsTerminator

__all__ = ["GroupOp", "YieldOp", "wrap", "unwrap", "GROUP_OPS"]


@irdl_op_definition
class YieldOp(IRDLOperation):
    """The results a `tpu.Group` hands out."""

    name = "tpu.Yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator())


@irdl_op_definition
class GroupOp(IRDLOperation):
    """A layer group: its ops (each with `group_info`) in one block ending in `tpu.Yield`;
    `group_info` on the group holds what all its ops share (group, slices, local bytes)."""

    name = "tpu.Group"
    body = region_def("single_block")
    outputs = var_result_def()
    group_info = opt_attr_def(DictionaryAttr)
    traits = traits_def()


GROUP_OPS = [GroupOp, YieldOp]
_SHARED = ("group", "n_slices", "h_slices", "local_bytes_per_lane")


def _group_of(op) -> int | None:
    info = op.attributes.get("group_info")
    if isinstance(info, DictionaryAttr) and isinstance(info.data.get("group"), IntegerAttr):
        return info.data["group"].value.data
    return None


def wrap(block) -> None:
    """Put each run of consecutive ops of `block` with one `group_info` group (and the weights
    between them) in a `tpu.Group`, in place."""
    from tftpu.ir.base import set_loc

    runs, run, current, between = [], [], None, []
    for op in list(block.ops):
        g = _group_of(op)
        if g is None and run and op.name in ("top.Weight", "top.None"):
            between.append(op)            # a group's weights may sit between its ops
            continue
        if g is not None and g == current:
            run.extend(between)
            run.append(op)
            between = []
            continue
        if run:
            runs.append(run)
        run, current, between = ([op], g, []) if g is not None else ([], None, [])
    if run:
        runs.append(run)
    for run in runs:
        inside = set(run)
        escaping = [r for op in run for r in op.results if any(u.operation not in inside for u in r.uses)]
        info = run[-1].attributes["group_info"].data
        group = GroupOp.create(result_types=[r.type for r in escaping], regions=[Region(Block())],
                               attributes={"group_info": DictionaryAttr({k: info[k] for k in _SHARED if k in info})})
        set_loc(group, f"group_{_group_of(run[-1])}")
        block.insert_op_before(group, run[0])
        for k, r in enumerate(escaping):
            r.replace_uses_with_if(group.results[k], lambda use, inside=inside: use.operation not in inside)
        body = group.body.block
        for op in run:
            op.detach()
            body.add_op(op)
        y = YieldOp.create(operands=escaping)
        set_loc(y, f"group_{_group_of(run[-1])}_yield")
        body.add_op(y)


def unwrap(module) -> None:
    """Flatten every `tpu.Group` of `module` in place (its ops back in the function, its uses
    on the values it yielded)."""
    for op in list(module.walk()):
        if not isinstance(op, GroupOp):
            continue
        inner = list(op.body.block.ops)
        y = inner[-1]
        for o in inner[:-1]:
            o.detach()
            op.parent_block().insert_op_before(o, op)
        for r, v in zip(op.results, y.operands):
            r.replace_all_uses_with(v)
        y.detach()
        y.erase()
        op.detach()
        op.erase()
