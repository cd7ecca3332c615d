"""benchmarks/gpu/host_ops.py --ranks 2: both EP paths counted on spawned gloo ranks, per layer and per 1F1B pair."""

from benchmarks.gpu import host_ops


def test_counts_both_ep_paths_of_a_layer_and_a_1f1b_pair_on_two_gloo_ranks():
    res = host_ops.count_ep("small", "cpu", 2, iters=1, timed_runs=1)
    default, sync_free = res["default"], res["sync_free"]
    # each path issues its own all-to-all autograd nodes, twice per layer step (dispatch and combine)
    assert default["layer"].get("_AllToAll") == 2.0 and "_AllToAllEqual" not in default["layer"]
    assert sync_free["layer"].get("_AllToAllEqual") == 2.0 and "_AllToAll" not in sync_free["layer"]
    # the pair counts only what runs inside layer_pair: both micro-batches' expert nodes, no embedding
    for row in (default, sync_free):
        assert row["pair"].get("_ExpertsFn") == 1.0 and row["pair"].get("_ExpertsFnBackward") == 1.0
        assert "aten::embedding" not in row["pair"]
    assert sync_free["pair"].get("aten::searchsorted", 0) > default["pair"].get("aten::searchsorted", 0)
