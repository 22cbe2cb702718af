"""The exact pick against brute force on random subgraph DAGs; TensorFlow's greedy pick beside it."""

import random

import pytest

from tftpu.tac.hardware.base import TargetHardware
from tftpu.tac.passes.pick import Problem, brute_force, pick_exact, pick_greedy, uniform_plan

TYPES = ("FLOAT", "QUANTIZED_INT8", "HYBRID")


class FakeHW(TargetHardware):
    def __init__(self, name, per_byte, fixed, q):
        self.name = name
        self.transfer_us_per_byte = per_byte
        self.transfer_fixed_us = fixed
        self._q = {"quant_us_per_element": q, "dequant_us_per_element": q * 1.5, "requant_us_per_element": q * 2}

    def quant_costs(self):
        return self._q

    def is_op_supported(self, op):  # the pick only sees costs already computed per view
        return True

    def get_op_cost(self, op):
        return 0.0


def random_problem(rng: random.Random, n: int, max_views: int = 3, density: float = 0.4) -> Problem:
    hws = {"CPU": FakeHW("CPU", 0.0, 0.0, rng.uniform(0, 0.01)),
           "GPU": FakeHW("GPU", rng.uniform(0, 0.01), rng.uniform(0, 50), rng.uniform(0, 0.01)),
           "NPU": FakeHW("NPU", rng.uniform(0, 0.01), rng.uniform(0, 80), rng.uniform(0, 0.01))}
    choices, compute = [], []
    for _ in range(n):
        k = rng.randint(1, max_views)
        devs = rng.sample(["CPU", "GPU", "NPU"], k)
        choices.append([(d, rng.choice(TYPES)) for d in devs])
        compute.append([rng.uniform(0, 200) for _ in devs])
    edges = {}
    for j in range(n):
        for i in range(j):
            if rng.random() < density:
                edges[(i, j)] = (rng.randint(1, 40000), rng.randint(1, 10000))
    host_in = [[rng.choice([0, 0, rng.randint(1, 50000)]), 0] for _ in range(n)]
    host_out = [[rng.choice([0, rng.randint(1, 50000)]), 0] for _ in range(n)]
    return Problem(choices, compute, edges, host_in, host_out, hws.__getitem__)


@pytest.mark.parametrize("seed", range(6))
def test_exact_pick_equals_brute_force(seed):
    rng = random.Random(seed)
    worse = 0
    for trial in range(60):
        n = rng.randint(1, 8)
        problem = random_problem(rng, n, density=rng.choice([0.2, 0.4, 0.7]))
        exact = pick_exact(problem)
        best = brute_force(problem)
        assert exact.exact
        assert exact.cost == pytest.approx(problem.cost(exact.plan), rel=1e-12)
        assert exact.cost == pytest.approx(best.cost, rel=1e-9, abs=1e-9), (seed, trial)
        greedy = pick_greedy(problem)
        assert greedy.cost >= best.cost - 1e-9
        worse += greedy.cost > best.cost + 1e-6
    assert worse > 0  # the greedy pick is not optimal on some of these DAGs


def test_wide_graph_exact_and_beam():
    rng = random.Random(7)
    # one producer feeding many consumers, all joined at the end: the frontier grows wide
    n = 10
    problem = random_problem(rng, n, max_views=2, density=0.0)
    edges = {(0, j): (1000, 100) for j in range(1, n - 1)}
    edges.update({(j, n - 1): (1000, 100) for j in range(1, n - 1)})
    problem = Problem(problem.choices, problem.compute, edges, problem.host_in, problem.host_out, problem.hardware)
    exact = pick_exact(problem)
    assert exact.exact
    assert exact.cost == pytest.approx(brute_force(problem).cost)
    beam = pick_exact(problem, max_states=1)
    assert beam.cost >= exact.cost - 1e-9
    assert not beam.exact  # the beam had to drop states, and says so


def test_greedy_conflict_falls_back_to_annotation():
    # A feeds B and C; B prefers A on GPU, C prefers A on CPU -> TF's pick gives up
    hw = {"CPU": FakeHW("CPU", 0.0, 0.0, 0.0), "GPU": FakeHW("GPU", 0.01, 100.0, 0.0)}
    choices = [[("CPU", "FLOAT"), ("GPU", "FLOAT")], [("GPU", "FLOAT")], [("CPU", "FLOAT")]]
    compute = [[50.0, 10.0], [5.0], [5.0]]
    edges = {(0, 1): (1000, 250), (0, 2): (100000, 25000)}
    problem = Problem(choices, compute, edges, [[0, 0]] * 3, [[0, 0], [4, 1], [4, 1]], hw.__getitem__)
    greedy = pick_greedy(problem)
    exact = pick_exact(problem)
    assert greedy.fell_back and greedy.plan == [0, 0, 0]
    assert exact.cost == pytest.approx(brute_force(problem).cost)
    assert exact.cost <= greedy.cost


def test_uniform_plan():
    rng = random.Random(3)
    problem = random_problem(rng, 5)
    for dev in ("CPU", "GPU", "NPU"):
        plan = uniform_plan(problem, dev)
        if plan is None:
            assert any(all(d != dev for d, _ in c) for c in problem.choices)
        else:
            assert all(problem.choices[v][b][0] == dev for v, b in enumerate(plan))


def test_quant_dequant_cost_counts():
    hw = {"CPU": FakeHW("CPU", 0.0, 0.0, 1.0)}
    choices = [[("CPU", "QUANTIZED_INT8")], [("CPU", "FLOAT"), ("CPU", "QUANTIZED_INT8")]]
    problem = Problem(choices, [[0.0], [10.0, 11.0]], {(0, 1): (400, 100)}, [[0, 0]] * 2, [[0, 0]] * 2,
                      hw.__getitem__)
    # dequantizing 100 elements costs 150, staying int8 costs 1 more compute
    assert problem.cost([0, 0]) == pytest.approx(10.0 + 150.0)
    assert pick_exact(problem).plan == [0, 1]
