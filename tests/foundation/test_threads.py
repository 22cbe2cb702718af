"""numpy's BLAS pool held to one thread inside the refit and the rounding reconstruction, and
given back as it was after (also when they raise)."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from tftpu.utils.threads import one_blas_thread


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_one_blas_thread_holds_the_pool_and_gives_it_back():
    np.ones((2, 2)) @ np.ones((2, 2))           # (BLAS loaded)
    before = _blas_threads()
    assert before, "numpy's BLAS is not visible to threadpoolctl"
    seen = []

    @one_blas_thread
    def work(x):
        seen.extend(_blas_threads())
        return x @ x

    assert np.array_equal(work(np.eye(3)), np.eye(3))
    assert seen and set(seen) == {1}
    assert _blas_threads() == before

    @one_blas_thread
    def fails():
        raise ValueError("bad")

    with pytest.raises(ValueError):
        fails()
    assert _blas_threads() == before


def test_the_refit_and_the_rounding_run_on_one_blas_thread():
    from tftpu.quant.bias_correction import correct_biases
    from tftpu.quant.weight_rounding import reconstruct_rounding
    assert correct_biases.__wrapped__ is not None and reconstruct_rounding.__wrapped__ is not None
