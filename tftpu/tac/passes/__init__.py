"""TAC passes, in pipeline order: annotate, raise_subgraphs, views (alternative views + costs,
with `lowerings`), pick (exact dynamic programming; TensorFlow's greedy pick for comparison)."""
