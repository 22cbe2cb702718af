"""tftpu.utils.names.unique_name: the one fresh-name picker behind weights, graph nodes and layout values."""

import pytest

from tftpu.utils.names import unique_name


@pytest.mark.parametrize("taken,want", [
    (set(), "w"), ({"x"}, "w"), ({"w"}, "w_1"), ({"w", "w_1"}, "w_2"), ({"w", "w_2"}, "w_1"),
    ({"w", "w_1", "w_2", "w_3"}, "w_4"), ({"w_1"}, "w"), ({"w": 0, "w_1": 1}, "w_2"), (["w"], "w_1"),
])
def test_unique_name(taken, want):
    assert unique_name("w", taken) == want


def test_builder_weight_names():
    import numpy as np

    from tftpu.ir.module import TopBuilder

    b = TopBuilder("m")
    b.weights.update({"k": np.zeros(1), "k_1": np.zeros(1)})
    assert b.unique_weight_name("k") == "k_2" and b.unique_weight_name("q") == "q"
    b.weight("k", np.ones(2, np.float32))  # a new array under a taken name gets the next free one
    assert "k_2" in b.weights and b.weights["k_2"].tolist() == [1.0, 1.0]
