"""benchmarks/host_ops.py on the CPU path: it counts the layer's ops by name and diffs two files."""

import json
import sys

from tests.benchmark_modules import load_benchmark


def test_counts_ops_of_one_cpu_step_and_diffs_two_files(tmp_path, capsys, monkeypatch):
    host_ops = load_benchmark("host_ops")
    ops, step_ms = host_ops.count("small", "cpu", iters=1)
    assert step_ms > 0
    # The layer's own autograd nodes are issued once per step, forward and backward.
    for name in ("_ExpertsFn", "_ExpertsFnBackward", "_PermuteFn", "_UnpermuteFnBackward"):
        assert ops.get(name) == 1.0, name
    before = dict(ops, **{"#step_ms": step_ms})
    after = dict(ops, **{"aten::index_select": ops.get("aten::index_select", 0) + 2})
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    monkeypatch.setattr(sys, "argv", ["host_ops.py", "--diff", str(tmp_path / "b.json"), str(tmp_path / "a.json")])
    assert host_ops.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:-1]] == ["aten::index_select"], out
    assert out[-1].split()[0] == "total" and "#step_ms" not in "".join(out)


def test_counts_both_ep_paths_of_a_layer_and_a_1f1b_pair_on_two_gloo_ranks():
    host_ops = load_benchmark("host_ops")
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
