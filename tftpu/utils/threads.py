"""How many threads this process's own pools may use (the INT8 kernels' pool, their onnxruntime
sessions): the cores it may run on, at most 4, or the share a local worker was given.

`tftpu.utils.distributed.launch` starts N workers on one machine with `TFTPU_WORKER_THREADS` set
to cores / N, so N workers do not each start a pool as wide as the machine and fight over its
cores. Integer kernels give the same integers on any number of threads.
"""

from __future__ import annotations

import functools
import os

__all__ = ["ENV", "BLAS_ENV", "cores", "pool_size", "one_blas_thread"]

ENV = "TFTPU_WORKER_THREADS"
#: What sizes numpy's BLAS pool (OpenBLAS, or MKL / OpenMP builds); read when numpy loads.
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
MAX_POOL = 4


def cores() -> int:
    """The cores this process may run on (its affinity mask), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def pool_size() -> int:
    """Threads for this process's pools: `TFTPU_WORKER_THREADS` where a launcher set it, else
    the cores it may run on, at most `MAX_POOL`."""
    share = os.environ.get(ENV, "").strip()
    if share.isdigit() and int(share) > 0:
        return int(share)
    return min(cores(), MAX_POOL)


def one_blas_thread(fn):
    """`fn` run with numpy's BLAS held to one thread. For loops of many small products (a
    refit's per-conv Gram matrices): a wider pool gains nothing there, and where another process
    holds a core its idle threads spin and each product waits on them (measured: a layout
    detector's refit 14 s alone, 27 s beside one busy process, 15 s on one thread)."""
    @functools.wraps(fn)
    def held(*args, **kwargs):
        from threadpoolctl import threadpool_limits
        with threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)
    return held
