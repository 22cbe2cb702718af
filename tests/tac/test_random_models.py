"""Random small graphs built with TF's converter: TAC output runs like the input, for every plan."""

import numpy as np
import pytest

import tftpu.tac as tac
from tftpu.tac.passes.pick import brute_force
from tests.tac import models
from tests.tac.plugin_hw import LowerAll


def random_model(seed: int) -> tuple[bytes, bool]:
    """A random DAG over conv / sub / pack / split / squared difference / concat / mean / FC.
    Returns the model and whether it holds ops whose lowering reorders float sums."""
    tf = models._tf()
    rng = np.random.default_rng(seed)
    c = int(rng.choice([4, 8]))
    size = int(rng.choice([4, 8, 16]))
    steps = int(rng.integers(4, 10))
    plan = [(int(rng.integers(0, 8)), int(rng.integers(0, 1 << 30))) for _ in range(steps)]
    reorders = any(kind in (6, 7) for kind, _ in plan)

    def fn(x):
        vals = [x]
        for kind, r in plan:
            a = vals[r % len(vals)]
            b = vals[(r >> 8) % len(vals)]
            w = np.random.default_rng(r).standard_normal((3, 3, c, c)).astype(np.float32) * 0.2
            if kind == 0:
                y = tf.nn.relu(tf.nn.conv2d(a, w, 1, "SAME"))
            elif kind == 1:
                y = a - b
            elif kind == 2:
                k = (r >> 16) % 4
                st = tf.stack([tf.reshape(a, [size, size, c]), tf.reshape(b, [size, size, c])], axis=k)
                begin, extent = [0] * 4, [-1] * 4
                begin[k], extent[k] = 1, 1
                y = tf.reshape(tf.slice(st, begin, extent), [1, size, size, c]) * 0.5
            elif kind == 3:
                p, q = tf.split(a, 2, axis=3)
                y = tf.concat([q, p], axis=3)
            elif kind == 4:
                y = tf.math.squared_difference(a, b) * 0.1
            elif kind == 5:
                p, q, s = tf.split(a, [c // 4, c // 4, c // 2], axis=3)
                y = tf.concat([s, q, p], axis=3) + b
            elif kind == 6:
                y = a + tf.reduce_mean(b, axis=[1, 2], keepdims=True)
            else:
                fw = np.random.default_rng(r + 1).standard_normal((c, c)).astype(np.float32) * 0.3
                y = tf.reshape(tf.matmul(tf.reshape(a, [-1, c]), fw), [1, size, size, c])
            vals.append(y)
        return vals[-1], vals[len(vals) // 2]

    return models.convert(fn, [(1, size, size, c)]), reorders


@pytest.mark.parametrize("seed", range(12))
def test_random_model(seed):
    data, reorders = random_model(seed)
    for specs in (("GPU", "CPU"), (LowerAll,), ("NNAPI", "GPU", "CPU")):
        result = tac.run(data, device_specs=specs)
        part = result.partitions[0]
        if np.prod([len(v) for v in part.views]) <= 20_000:
            assert part.picked.cost == pytest.approx(brute_force(part.problem).cost)
        for s in range(2):
            for a, b in zip(models.run_tflite(data, seed=s), models.run_tflite(result.tflite(), seed=s)):
                if reorders:
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
                else:
                    assert np.array_equal(a, b)
