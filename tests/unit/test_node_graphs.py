"""Where the experts-node CUDA graphs apply (ep/node_graphs.py) and what verify's worker records about them."""

from __future__ import annotations

import argparse

import torch

from moe_overlap.ep.node_graphs import graphs_apply
from moe_overlap.verify.run.worker import graphs_setting, parse_args

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_graphs_apply_where_the_node_has_no_host_state():
    assert graphs_apply(CUDA, local=True, sync_free=False, delayed_wgrad=False) == (True, "experts node graphed (EP 1)")
    assert graphs_apply(CUDA, local=False, sync_free=True, delayed_wgrad=False)[0]
    ok, why = graphs_apply(CUDA, local=False, sync_free=False, delayed_wgrad=False)
    assert not ok and "splits come to the host" in why
    ok, why = graphs_apply(CUDA, local=True, sync_free=False, delayed_wgrad=True)
    assert not ok and "delayed wgrad" in why
    ok, why = graphs_apply(CPU, local=True, sync_free=False, delayed_wgrad=False)
    assert not ok and "CUDA device" in why


def test_worker_defaults_to_graphs_on_cuda_only_and_says_where():
    args = parse_args(["--config", "c.json", "--modes", "baseline", "--out", "o"])
    assert args.graphs == "auto" and not args.sync_free
    on, note = graphs_setting(args, CUDA)
    assert on and "EP 1" in note and "only with --sync-free" in note
    assert graphs_setting(args, CPU) == (False, "off (CPU ranks: CUDA graphs need a CUDA device)")
    assert graphs_setting(argparse.Namespace(graphs="off", sync_free=False), CUDA) == (False, "off (asked)")
    on, note = graphs_setting(argparse.Namespace(graphs="auto", sync_free=True), CUDA)
    assert on and "the sync-free EP path" in note


def test_a_failed_capture_runs_the_node_eagerly_and_says_so():
    from moe_overlap.ep.experts import GroupedExperts
    from moe_overlap.ep.node_graphs import ExpertGraphs, accumulate, node_inputs, weight_leaves

    def broken(node, samples):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    experts = GroupedExperts(2, 16, 16)
    graphs = ExpertGraphs(maker=broken)
    recv = torch.randn(6, 16, requires_grad=True)
    probs = torch.rand(6, requires_grad=True)
    plan = argparse.Namespace(tokens_per_local_expert=torch.tensor([2, 4]))
    leaves = weight_leaves(experts)
    y = graphs.run(experts, 0, False, node_inputs(recv, plan, probs, False, leaves))
    y.sum().backward()
    accumulate(experts, leaves)
    want = experts(recv.detach(), torch.tensor([2, 4]), probs_S=probs.detach())
    assert torch.equal(y, want) and experts.w1.grad is not None and graphs.captured == 0
    assert graphs.error == "RuntimeError: operation not permitted when stream is capturing"
