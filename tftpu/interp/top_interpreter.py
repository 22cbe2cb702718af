"""Reference inference of a TOP module: walk its ops in order and call the numpy kernels.

The walk is compiled once into a flat plan (kernel, operand slots, attrs), intermediates are
freed after their last use, and `dump_all=True` keeps every tensor keyed by location name.

>>> outputs = run(model, {"input": x})  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import NoneType

from tftpu.errors import InternalError, KernelError, ShapeError, TftpuError
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.ir.module import TopModel, value_name
from tftpu.utils.inputs import match_inputs, numeric


class TopInterpreter:
    """A compiled plan for running one TOP model many times.

    `backend="eager"` calls the numpy/TF kernels op by op; `"compiled"` lowers the whole model
    once into one TensorFlow graph (`tftpu.interp.compiled`), much faster on small-tensor
    models. `run(..., dump_all=True)` always takes the per-op path (it keeps every tensor).
    """

    BACKENDS = ("eager", "compiled")

    def __init__(self, model: TopModel, backend: str = "eager"):
        if backend not in self.BACKENDS:
            from tftpu.errors import UsageError
            raise UsageError(f"backend must be one of {', '.join(self.BACKENDS)}, not {backend!r}")
        self.model = model
        self.backend = backend
        self._compiled = None
        slot: dict = {}
        self.inputs: list[tuple[str, int, tuple, np.dtype]] = []
        self.consts: dict[int, np.ndarray] = {}
        self.names: dict[int, str] = {}
        self.steps: list = []
        missing = []
        for op in model.ops:
            if isinstance(op, top.NoneOp):
                continue
            outs = []
            for r in op.results:
                slot[r] = len(slot)
                outs.append(slot[r])
                self.names[slot[r]] = value_name(r)
            if isinstance(op, top.Input):
                t = op.output.type
                self.inputs.append((op.loc, outs[0], A.shape_of(t), A.numpy_dtype(A.dtype_name(t.element_type))))
            elif isinstance(op, top.Weight):
                arr = model.weights.get(op.key)
                if arr is None:
                    raise ShapeError(f"{model.name}: weight {op.key!r} is missing")
                self.consts[outs[0]] = arr
            else:
                kernel = self.kernel_for(op)
                if kernel is None:
                    missing.append(op.name)
                ins = [None if isinstance(v.type, NoneType) else slot[v]
                       for v in op.operands]
                self.steps.append((kernel, ins, outs, op.attrs(), op.name, op.loc))
        if missing:
            from tftpu.errors import UnsupportedOpError
            raise UnsupportedOpError([(m, "no inference kernel") for m in sorted(set(missing))], model.name)
        self.outputs = [(value_name(v), slot[v]) for v in model.return_op.operands]
        self._slot_of = {name: s for s, name in self.names.items()}
        keep = {s for _, s in self.outputs} | set(self.consts)
        last: dict[int, int] = {}
        for i, (_, ins, _, _, _, _) in enumerate(self.steps):
            for s in ins:
                if s is not None:
                    last[s] = i
        self.free_after = [[s for s, i in last.items() if i == k and s not in keep] for k in range(len(self.steps))]

    def kernel_for(self, op):
        """The kernel that runs `op` (None if there is none): the TOP kernel of its full name."""
        from tftpu.interp.kernels import KERNELS

        return KERNELS.get(op.name)

    def _bind(self, inputs: dict) -> dict[int, np.ndarray]:
        arrays = match_inputs([n for n, _, _, _ in self.inputs], inputs)
        env = {}
        for (name, s, shape, dtype), arr in zip(self.inputs, arrays):
            arr = numeric(name, arr)
            if tuple(arr.shape) != shape:
                raise ShapeError(f"input {name!r} has shape {list(arr.shape)}, the model wants {list(shape)}")
            env[s] = arr.astype(dtype, copy=False)
        return env

    def run(self, inputs: dict, dump_all: bool = False, observe=None, keep=()) -> dict[str, np.ndarray]:
        """Outputs by name (every tensor by location name when `dump_all`), and the tensors
        named in `keep` (inner tensors too; the rest are freed as the run goes).

        `observe(name, array) -> array`, if given, sees each input and op result as it is made
        and returns what the rest of the model uses instead (e.g. a fake-quantized copy); it
        runs on the per-op path.
        """
        keep = set(keep) - {name for name, _ in self.outputs}
        if self.backend == "compiled" and not dump_all and observe is None and not keep:
            if self._compiled is None:
                from tftpu.interp.compiled import CompiledTop
                self._compiled = CompiledTop(self.model)
            return self._compiled.run(inputs)
        env = dict(self.consts)
        env.update(self._bind(inputs))
        if observe is not None:
            for name, s, _, _ in self.inputs:
                env[s] = observe(name, env[s])
        dump = {}
        for name, s, _, _ in self.inputs:
            if dump_all or name in keep:
                dump[name] = env[s]
        for k, (kernel, ins, outs, attrs, op_name, loc) in enumerate(self.steps):
            try:
                results = kernel([None if s is None else env[s] for s in ins], attrs)
            except (TftpuError, InternalError):
                raise
            except Exception as e:
                raise KernelError(f"{op_name} at {loc!r}", f"kernel failed: {type(e).__name__}: {e}") from e
            for s, r in zip(outs, results):
                if observe is not None:
                    r = observe(self.names[s], r)
                env[s] = r
                if dump_all or self.names[s] in keep:
                    dump[self.names[s]] = r
            for s in self.free_after[k]:
                del env[s]
        if dump_all:
            return dump
        return {**{name: env[s] for name, s in self.outputs}, **dump}

    def rerun(self, dump: dict, changed: dict) -> dict[str, np.ndarray]:
        """Every tensor that depends on `changed` (name -> array), recomputed with those arrays
        in place of `dump`'s (a `run(..., dump_all=True)` of this model); the rest is read from
        `dump`. What a perturbation of a few tensors does downstream, at the cost of the ops it reaches."""
        env = {self._slot_of[name]: arr for name, arr in changed.items()}
        for kernel, ins, outs, attrs, _, _ in self.steps:
            if not any(s in env for s in ins if s is not None):
                continue
            args = [None if s is None else env[s] if s in env else self.consts[s] if s in self.consts
                    else dump[self.names[s]] for s in ins]
            for s, r in zip(outs, kernel(args, attrs)):
                env[s] = r
        return {self.names[s]: arr for s, arr in env.items()}


def run(model: TopModel, inputs: dict, dump_all: bool = False,
        backend: str = "eager") -> dict[str, np.ndarray]:
    """Run `model` on `inputs` (name -> array, or in input order when names differ)."""
    return TopInterpreter(model, backend).run(inputs, dump_all)
