"""tftpu.utils.spd: Cholesky-based solves and GPTQ's inverse factor equal the general routines."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu.utils import spd


def _spd(rng, batch, n, rank=None):
    x = rng.standard_normal((batch, rank or 2 * n, n))
    return np.swapaxes(x, 1, 2) @ x / x.shape[1] + 1e-3 * np.eye(n)


@settings(max_examples=12, deadline=None)
@given(n=st.sampled_from([1, 5, spd.SMALL - 1, spd.SMALL, 97, 200]), batch=st.integers(1, 3),
       m=st.integers(1, 7), seed=st.integers(0, 2 ** 16))
def test_solve_and_inverse_factor_match_the_general_routines(n, batch, m, seed):
    rng = np.random.default_rng(seed)
    a = _spd(rng, batch, n)
    b = rng.standard_normal((batch, n, m))
    np.testing.assert_allclose(spd.solve(a, b), np.linalg.solve(a, b), rtol=1e-8, atol=1e-8)
    u = spd.inverse_cholesky_upper(a)
    assert np.array_equal(u, np.triu(u))
    np.testing.assert_allclose(np.swapaxes(u, 1, 2) @ u, np.linalg.inv(a), rtol=1e-8, atol=1e-8)


def test_a_matrix_cholesky_rejects_falls_back_to_lu_as_numpy_solves_it():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((100, 100)))
    a = (q * np.where(np.arange(100) % 2, 1.0, -1.0)) @ q.T       # symmetric, indefinite
    b = rng.standard_normal((1, 100, 2))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(a)
    np.testing.assert_array_equal(spd.solve(a[None], b), np.linalg.solve(a[None], b))
