"""The host-sync-free EP path (ep/sync_free.py) == the default path, bit for bit, with no host read inside.

fp32 on CPU with 2 and 4 gloo ranks, each rank's data drawn from its own seed and marked by its rank (every
token of rank r is shifted by r, so equal results cannot come from equal inputs): a verification-style run
(3 Adam steps of 3 micro-batches, the three modes none / 1f1b / 1f1b + delayed wgrad), per step the losses
of every micro-batch, the first step's gradients and the final parameters. Then the new path once more with
every host read of a tensor raising (tests/distributed/_host_sync.py), and the default path under the same
guard, which must raise (the guard can fail). The layer's own path (``MoELayer(sync_free=True)``) too, and
its capacity-bounded form against the float64 reference with the dropped rows left out.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed._spawn import run_ranks

STEPS = 3
MICRO_BATCHES = 3
MODES = (("none", False), ("1f1b", False), ("1f1b", True))
CFG = dict(vocab_size=32, hidden=16, ffn=16, num_heads=2, num_layers=2, num_experts=8, topk=2, seed=3)


def _batches(rank: int, step: int, cfg, num: int, batch: int = 2, seq: int = 8):
    gen = torch.Generator().manual_seed(1000 * step + 17 * rank + 1)
    out = []
    for _ in range(num):
        tokens = (torch.randint(0, cfg.vocab_size - 4, (batch, seq), generator=gen) + rank) % cfg.vocab_size
        out.append((tokens, torch.roll(tokens, -1, dims=1)))
    return out


def _train(cfg, group, rank, schedule, delay, sync_free, guard=None):
    from moe_overlap.ep import step as step_mod
    from moe_overlap.ep.model import MoETransformer

    model = MoETransformer(cfg, group)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, grads = [], None
    orig = step_mod.run_1f1b, step_mod.run_sequential
    if guard is not None:  # only the nodes run under the guard (the step's id check and loss read stay outside)
        step_mod.run_1f1b = lambda runs, store: _guarded(guard, orig[0], runs, store)
        step_mod.run_sequential = lambda runs: _guarded(guard, orig[1], runs)
    try:
        for step in range(STEPS):
            res = step_mod.forward_backward(model, _batches(rank, step, cfg, MICRO_BATCHES), schedule=schedule,
                                            delay_wgrad=delay, group=group, sync_free=sync_free)
            losses.append(res.losses)
            if step == 0:
                grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
            opt.step()
    finally:
        step_mod.run_1f1b, step_mod.run_sequential = orig
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _guarded(guard, fn, *args):
    with guard():
        return fn(*args)


def _guard_outcome(cfg, group, rank, sync_free):
    from tests.distributed._host_sync import HostSyncError, no_host_reads

    try:
        _train(cfg, group, rank, "1f1b", True, sync_free, guard=no_host_reads)
    except HostSyncError as e:
        return str(e)
    return None


def _layer(rank, world, group):
    """MoELayer's own path: default vs sync_free (same bits), and a capacity of 3 rows per peer."""
    from moe_overlap.ep.layer import MoELayer

    layer = MoELayer(16, 16, 8, 2, group, seed=5)
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(50 + rank)) + rank
    out = {}
    for name, kw in (("default", {}), ("sync_free", {"sync_free": True}),
                     ("capacity", {"sync_free": True, "capacity": 3})):
        xx = x.clone().requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        y, aux = layer(xx, **kw)
        (y.square().sum() + aux).backward()
        out[name] = {"y": y.detach().numpy().copy(), "gx": xx.grad.numpy().copy(),
                     **{n: p.grad.numpy().copy() for n, p in layer.named_parameters()}}
    out["x"] = x.numpy().copy()
    from moe_overlap.ep.graphed import check_graphable
    from tests.distributed._host_sync import HostSyncError, no_host_reads

    try:  # the layer's own sync-free path, forward and backward, under the guard
        xx = x.clone().requires_grad_(True)
        with no_host_reads():
            y, aux = layer(xx, sync_free=True, capacity=3)
            torch.autograd.backward([y, aux], [torch.ones_like(y), torch.ones_like(aux)])
        out["layer_guard"] = None
    except HostSyncError as e:
        out["layer_guard"] = str(e)

    out["graph_refusals"] = []
    for sync_free in (False, True):  # EP > 1 over gloo: refused on both paths, each naming its reason
        try:
            check_graphable(layer, x, sync_free=sync_free)
            out["graph_refusals"].append(None)
        except ValueError as e:
            out["graph_refusals"].append(str(e))
    return out


def _graphed_wiring(cfg, group, rank):
    """forward_backward(graphs=...) with a stand-in for make_graphed_callables that returns the node module
    itself (no CUDA here): the wiring (inputs, slots, backward through the node module) keeps the bits."""
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.node_graphs import ExpertGraphs
    from moe_overlap.ep.step import forward_backward

    class AnyDevice(ExpertGraphs):
        def applies(self, device, local, sync_free, delayed_wgrad):
            return super().applies(torch.device("cuda"), local, sync_free, delayed_wgrad)

    out = {}
    for s, d in MODES:
        graphs = AnyDevice(maker=lambda node, samples: node)
        model = MoETransformer(cfg, group)
        res = forward_backward(model, _batches(rank, 0, cfg, MICRO_BATCHES), schedule=s, delay_wgrad=d,
                               group=group, sync_free=True, graphs=graphs)
        out[f"{s}+{d}"] = {"losses": res.losses, "notes": res.notes, "captured": graphs.captured,
                           "grads": {n: p.grad.numpy().copy() for n, p in model.named_parameters()}}
    return out


def _capacity_steps(cfg, group, rank):
    """1f1b + delayed wgrad through the nodes with a capacity of 2 rows per peer (drops) and of 10**6 (none)."""
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.step import forward_backward

    out = {}
    for cap in (2, 10**6):
        model = MoETransformer(cfg, group)
        res = forward_backward(model, _batches(rank, 0, cfg, MICRO_BATCHES), schedule="1f1b", delay_wgrad=True,
                               group=group, sync_free=True, capacity=cap)
        ref = forward_backward(MoETransformer(cfg, group), _batches(rank, 0, cfg, MICRO_BATCHES), schedule="none",
                               delay_wgrad=False, group=group, sync_free=True, capacity=cap)
        out[cap] = (res.losses, ref.losses)
    return out


def _body(rank, world, group, cfg_kwargs):
    from moe_overlap.ep.model import ModelConfig

    cfg = ModelConfig(**cfg_kwargs)
    out = {f"{s}+{d}+{sf}": _train(cfg, group, rank, s, d, sf) for s, d in MODES for sf in (False, True)}
    out["graphed"] = _graphed_wiring(cfg, group, rank)
    out["capacity_1f1b"] = _capacity_steps(cfg, group, rank)
    out["guard_new"] = _guard_outcome(cfg, group, rank, True)
    out["guard_old"] = _guard_outcome(cfg, group, rank, False)
    out["layer"] = _layer(rank, world, group)
    return out


def _assert_bitwise(ref: dict, got: dict, what: str) -> None:
    assert got["losses"] == ref["losses"], f"{what}: per-micro-batch losses differ"
    for kind in ("grads", "params"):
        for name, want in ref[kind].items():
            assert (got[kind][name] == want).all(), f"{what}: {kind} of {name} differ"


def _capacity_reference(xs, full, topk, cap):
    """Per-rank float64 outputs with each rank sending each peer only its first ``cap`` rows in dispatch order."""
    from moe_overlap.ep.refs import reference_expert, reference_route

    world, num_experts = len(xs), full["router.weight"].shape[0]
    local = num_experts // world
    outs = []
    for x in xs:
        probs, experts, _, _ = reference_route(x, full["router.weight"], topk=topk)
        order = sorted(range(experts.numel()), key=lambda i: (int(experts.view(-1)[i]), i))  # stable, by expert
        sent = [0] * world
        keep = torch.zeros(experts.numel(), dtype=torch.bool)
        for i in order:
            peer = int(experts.view(-1)[i]) // local
            keep[i] = sent[peer] < cap
            sent[peer] += 1
        out = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(x.shape[0]):
            for k in range(topk):
                if keep[t * topk + k]:
                    e = int(experts[t, k])
                    out[t] += probs[t, k] * reference_expert(x[t].double(), full["experts.w1"][e].double(),
                                                             full["experts.w2"][e].double())
        outs.append(out)
    return outs, keep


@pytest.mark.parametrize("world", [2, 4])
def test_sync_free_path_is_bitwise_the_default_path_without_host_reads(world):
    from moe_overlap.ep.layer import init_full_weights

    results = run_ranks(_body, world=world, args=(CFG,), timeout=300)
    for rank, res in enumerate(results):
        for s, d in MODES:
            ref = res[f"{s}+{d}+False"]
            assert ref["losses"][0] != ref["losses"][-1], "training did not move: the comparison would be vacuous"
            _assert_bitwise(ref, res[f"{s}+{d}+True"], f"rank {rank} {s} delay_wgrad={d}")
        # the modes agree with each other too (the default path's own 1f1b property), so all six runs are one
        _assert_bitwise(res["none+False+False"], res["1f1b+True+True"], f"rank {rank} 1f1b+wgrad sync-free vs none")
        assert res["guard_new"] is None, f"rank {rank}: a host read entered the sync-free path: {res['guard_new']}"
        assert res["guard_old"] and "tolist" in res["guard_old"], "the guard missed the default path's count read"
        for s, d in MODES:
            got, ref = res["graphed"][f"{s}+{d}"], res[f"{s}+{d}+True"]
            assert got["losses"] == ref["losses"][0], f"rank {rank} {s} {d}: graph wiring changed the losses"
            for name, g in ref["grads"].items():
                assert (got["grads"][name] == g).all(), f"rank {rank} {s} {d}: graph wiring changed {name}"
            # two slots per layer (micro-batch parity); none with delayed wgrad, which stays eager
            assert got["captured"] == (0 if d else 2 * CFG["num_layers"]), (s, d, got["captured"])
            assert any(("delayed wgrad" if d else "experts node graphed") in n for n in got["notes"]), got["notes"]
        dropped, dropless = res["capacity_1f1b"][2], res["capacity_1f1b"][10**6]
        assert dropped[0] == dropped[1], f"rank {rank}: with capacity, 1f1b+wgrad is not bitwise its none"
        assert dropless[0] == res["1f1b+True+False"]["losses"][0], "a capacity above T*K must drop nothing"
        assert dropped[0] != dropless[0], "capacity 2 dropped nothing: the check would be vacuous"
        lay = res["layer"]
        assert lay["layer_guard"] is None, f"rank {rank}: a host read in MoELayer(sync_free=True): {lay['layer_guard']}"
        default_why, sync_free_why = lay["graph_refusals"]
        assert default_why and "splits come to the host" in default_why and "sync_free=True" in default_why
        assert sync_free_why and "backend 'gloo'" in sync_free_why and "NCCL group" in sync_free_why
        for name, want in lay["default"].items():
            assert (lay["sync_free"][name] == want).all(), f"rank {rank}: layer {name} differs on the sync-free path"
    # ranks saw different data (the rank mark), so equal results are not equal inputs
    assert not (results[0]["none+False+False"]["losses"] == results[1]["none+False+False"]["losses"])
    # capacity 3 rows per peer: the layer drops rows (its output is not the dropless one) exactly as documented
    full = init_full_weights(16, 16, 8, seed=5)
    xs = [torch.from_numpy(r["layer"]["x"]) for r in results]
    want, _ = _capacity_reference(xs, full, 2, 3)
    for rank, res in enumerate(results):
        got = torch.from_numpy(res["layer"]["capacity"]["y"]).double()
        assert not (res["layer"]["capacity"]["y"] == res["layer"]["default"]["y"]).all(), "capacity 3 dropped nothing"
        torch.testing.assert_close(got, want[rank], rtol=1e-4, atol=1e-5)


def test_sync_free_refuses_what_needs_host_splits():
    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.ep.sync_free import check_usable, rows_per_peer

    with pytest.raises(ValueError, match="copy-engine transport takes host splits"):
        check_usable(object())
    with pytest.raises(ValueError, match="per-expert loop"):
        check_usable(None, "loop")
    with pytest.raises(ValueError, match="capacity=0"):
        rows_per_peer(8, 0)
    assert rows_per_peer(8, None) == 8 and rows_per_peer(8, 3) == 3 and rows_per_peer(8, 99) == 8
    with pytest.raises(ValueError, match="schedule='none'"):
        MoELayer(16, 8, 4, 2)(torch.randn(4, 16), schedule="chunked", sync_free=True)


def _world1(rank, world, group):
    """The EP > 1 code path forced at one rank (what the one-GPU benchmark measures): its collectives run on
    the one-rank group, no host read inside, and it computes the default EP 1 layer's function."""
    from moe_overlap.ep.layer import MoELayer
    from tests.distributed._host_sync import no_host_reads

    layer = MoELayer(16, 16, 8, 2, group, seed=5)
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(7))
    outs = []
    for sync_free in (False, True):
        xx = x.clone().requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        if sync_free:
            with no_host_reads():
                y, aux = layer(xx, sync_free=True)
                torch.autograd.backward([y, aux], [torch.ones_like(y), torch.ones_like(aux)])
        else:
            y, aux = layer(xx)
            torch.autograd.backward([y, aux], [torch.ones_like(y), torch.ones_like(aux)])
        outs.append([y.detach(), xx.grad] + [p.grad.clone() for p in layer.parameters()])
    return [(a - b).abs().max().item() / max(b.abs().max().item(), 1e-12) for a, b in zip(*outs, strict=True)]


def test_forced_sync_free_path_at_world_1_computes_the_ep1_layer():
    (rel,) = run_ranks(_world1, world=1, timeout=120)
    # EP 1 applies the routing weights in the experts' ffn space, the EP > 1 path in the combine: equal to rounding
    assert max(rel) < 1e-5, rel
