"""surgery.rebind: the one tensor-reference remapping behind GraphEditor.splice and function inlining."""

import pytest

from tftpu.graph.surgery import rebind

BOUND = {"x": "outer/conv:1", "y": "outer/relu"}


@pytest.mark.parametrize("tensor,want", [
    ("x", "outer/conv:1"), ("x:0", "outer/conv:1"), ("^x", "^outer/conv"), ("^y", "^outer/relu"),
    ("y", "outer/relu"), ("add", "p/add"), ("add:0", "p/add"), ("add:2", "p/add:2"), ("^add", "^p/add"),
    ("a/b:1", "p/a/b:1"),
])
def test_rebind(tensor, want):
    assert rebind(tensor, BOUND, lambda n: f"p/{n}") == want
    assert rebind(tensor, BOUND, {n: f"p/{n}" for n in ("add", "a/b")}.get) == want
