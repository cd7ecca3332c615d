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
