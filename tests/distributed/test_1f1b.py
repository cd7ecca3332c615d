"""1F1B cross-micro-batch overlap (+ delayed expert wgrad) == the sequential schedule, bit for bit.

fp32 on CPU with 2 and 4 gloo ranks: for every one of 5 optimizer steps, the loss of every
micro-batch; after the first step every parameter gradient; after the 5th step every parameter.
All three schedules run in the same rank processes on models built from the same seed.
"""

from __future__ import annotations

import pytest
import torch

from moe_overlap.ep.step import StepConfigError, check_step_options
from tests.distributed._spawn import run_ranks

STEPS = 5
MICRO_BATCHES = 3
MODES = (("none", False), ("1f1b", False), ("1f1b", True))


def _batches(rank: int, step: int, cfg, num: int, batch: int = 2, seq: int = 8):
    gen = torch.Generator().manual_seed(1000 * step + 17 * rank + 1)
    out = []
    for _ in range(num):
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
        out.append((tokens, torch.roll(tokens, -1, dims=1)))
    return out


def _train(cfg, group, rank, schedule, delay, micro_batches, steps=STEPS, counts_group=None):
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.step import forward_backward

    model = MoETransformer(cfg, group)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, grads, notes = [], None, []
    for step in range(steps):
        res = forward_backward(model, _batches(rank, step, cfg, micro_batches), schedule=schedule,
                               delay_wgrad=delay, chunks=1, group=group, counts_group=counts_group)
        losses.append(res.losses)
        notes += res.notes
        if step == 0:
            grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
    # numpy, not tensors: tensors cross the result queue through shared-memory fds that vanish
    # with the exiting child.
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params, "notes": notes}


def _body(rank, world, group, cfg_kwargs, extras):
    from moe_overlap.ep.model import ModelConfig

    cfg = ModelConfig(**cfg_kwargs)
    out = {f"{s}+{d}": _train(cfg, group, rank, s, d, MICRO_BATCHES) for s, d in MODES}
    if extras:  # schedule-shape checks, once (world 2): the CPU budget of CI is small
        import torch.distributed as dist

        # Counts over their own host group (what GPU runs do, off the data communicator): same bits.
        counts_group = dist.new_group(backend="gloo")
        out["1f1b+True counts_group"] = _train(cfg, group, rank, "1f1b", True, MICRO_BATCHES,
                                               counts_group=counts_group)
        out["single"] = _train(cfg, group, rank, "1f1b", True, 1, steps=2)
        out["single_ref"] = _train(cfg, group, rank, "none", False, 1, steps=2)
        out["trace"] = _trace_1f1b(cfg, group, rank)
        out["autograd"] = {ls: _autograd_grads(cfg, group, rank, ls) for ls in ("none", "chunked")}
        out["init_mismatch"] = _init_mismatch(cfg, group, rank, world)
    return out


def _init_mismatch(cfg, group, rank, world):
    """Names of parameters whose EP-`world` init is not the EP-1 init (or its expert slice)."""
    import torch.distributed as dist

    from moe_overlap.ep.model import MoETransformer

    solo = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    full = dict(MoETransformer(cfg, solo).named_parameters())
    bad = []
    for name, p in MoETransformer(cfg, group).named_parameters():
        want = full[name]
        if "experts" in name:
            want = want[rank * p.shape[0]:(rank + 1) * p.shape[0]]
        if not torch.equal(p, want):
            bad.append(name)
    return bad


def _autograd_grads(cfg, group, rank, layer_schedule):
    """First-step losses and gradients through plain autograd (MoELayer's own path), no nodes."""
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.step import autograd_forward_backward

    model = MoETransformer(cfg, group)
    res = autograd_forward_backward(model, _batches(rank, 0, cfg, MICRO_BATCHES), layer_schedule=layer_schedule,
                                    chunks=2, group=group)
    return {"losses": res.losses, "grads": {n: p.grad.numpy().copy() for n, p in model.named_parameters()}}


def _trace_1f1b(cfg, group, rank):
    """Node order of one 1f1b + delayed-wgrad step with 2 micro-batches: [(node, micro-batch, layer)]."""
    from moe_overlap.ep import nodes, wgrad
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.step import forward_backward

    model = MoETransformer(cfg, group)
    trace, tags = [], {}
    layer_of = {id(blk): i for i, blk in enumerate(model.layers)}

    def wrap(name):
        orig = getattr(nodes.LayerRun, name)

        def traced(self, *a):
            if id(self) not in tags:
                tags[id(self)] = len(tags) // len(model.layers)  # LayerRuns are built micro-batch by micro-batch
            trace.append((name, tags[id(self)], layer_of[id(self.block)]))
            return orig(self, *a)
        return orig, traced

    names = [n for n in vars(nodes.LayerRun) if n.endswith(("_forward", "_backward", "_start", "_wait"))]
    origs = {}
    orig_run_all = wgrad.WgradStore.run_all
    try:
        for n in names:
            origs[n], traced = wrap(n)
            setattr(nodes.LayerRun, n, traced)
        wgrad.WgradStore.run_all = lambda self: trace.append(("wgrad", self.pending, -1)) or orig_run_all(self)
        forward_backward(model, _batches(rank, 0, cfg, 2), schedule="1f1b", delay_wgrad=True, chunks=1,
                         group=group)
    finally:
        for n, f in origs.items():
            setattr(nodes.LayerRun, n, f)
        wgrad.WgradStore.run_all = orig_run_all
    return trace


def _assert_bitwise(ref: dict, got: dict, what: str) -> None:
    assert got["losses"] == ref["losses"], f"{what}: per-micro-batch losses differ"
    for kind in ("grads", "params"):
        assert ref[kind].keys() == got[kind].keys()
        for name, want_np in ref[kind].items():
            want, have = torch.from_numpy(want_np), torch.from_numpy(got[kind][name])
            assert torch.equal(have, want), f"{what}: {kind} of {name} differ " \
                f"(max abs diff {(have - want).abs().max().item():.3e})"


@pytest.mark.parametrize("world", [2, 4])
def test_1f1b_bitwise_equals_sequential(world):
    cfg = dict(vocab_size=32, hidden=16, ffn=16, num_heads=2, num_layers=2, num_experts=8, topk=2, seed=3)
    results = run_ranks(_body, world=world, args=(cfg, world == 2), timeout=240)
    for rank, res in enumerate(results):
        ref = res["none+False"]
        assert all(len(ls) == MICRO_BATCHES for ls in ref["losses"])
        assert ref["losses"][0] != ref["losses"][-1], "training did not move: the comparison would be vacuous"
        assert any(abs(g).sum() > 0 for n, g in ref["grads"].items() if "experts" in n)
        _assert_bitwise(ref, res["1f1b+False"], f"rank {rank} 1f1b")
        _assert_bitwise(ref, res["1f1b+True"], f"rank {rank} 1f1b+delayed wgrad")
        assert not res["1f1b+True"]["notes"]
        if world == 2:
            _assert_bitwise(ref, res["1f1b+True counts_group"], f"rank {rank} 1f1b, counts over a host group")
            _assert_bitwise(res["single_ref"], res["single"], f"rank {rank} 1f1b with one micro-batch")
            assert any("single-micro-batch" in n for n in res["single"]["notes"])
            _check_trace(res["trace"], cfg["num_layers"])
            assert res["init_mismatch"] == [], "init must not depend on the EP size"
            for layer_schedule, other in res["autograd"].items():  # the node path computes the right thing
                assert other["losses"] == pytest.approx(ref["losses"][0], rel=1e-6), layer_schedule
                for name, g in ref["grads"].items():
                    torch.testing.assert_close(torch.from_numpy(other["grads"][name]), torch.from_numpy(g),
                                               rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    # Replicated parameters stay replicated (gradients are averaged over the group).
    for name, p in results[0]["1f1b+True"]["params"].items():
        if "experts" not in name:
            assert all((r["1f1b+True"]["params"][name] == p).all() for r in results[1:]), name


def _expected_overlapped_step(num_layers: int) -> list[tuple[str, int, int]]:
    """Megatron-Core's order (model_chunk_schedule_plan.py), per layer pair: forward layer i of micro-batch 1 | backward layer L-1-i of 0."""
    out = []
    for i in range(num_layers):
        f, b = (1, i), (0, num_layers - 1 - i)
        out += [("combine_backward_start", *b), ("pre_forward", *f), ("combine_backward_wait", *b),
                ("experts_backward", *b), ("plan_wait", *f),  # the host waits for f's counts under b's dgrad
                ("dispatch_forward_start", *f), ("dispatch_backward_start", *b),
                ("wgrad", 1, -1),  # b's one expert-wgrad closure, under b's backward dispatch
                ("dispatch_forward_wait", *f), ("experts_forward", *f), ("combine_forward_start", *f),
                ("dispatch_backward_wait", *b), ("pre_backward", *b),
                ("wgrad", 2, -1),  # b's attention qkv and proj wgrad, under f's forward combine
                ("combine_forward_wait", *f)]
    return out


def _check_trace(trace, num_layers: int) -> None:
    fwd = ["pre_forward", "plan_wait", "dispatch_forward_start", "dispatch_forward_wait", "experts_forward",
           "combine_forward_start", "combine_forward_wait"]
    first = [(n, 0, i) for i in range(num_layers) for n in fwd]
    pair = _expected_overlapped_step(num_layers)
    assert trace[:len(first)] == first, "micro-batch 0 forward must run alone first"
    assert trace[len(first):len(first) + len(pair)] == pair, "overlapped step out of Megatron-Core's layer-pair order"
    rest = trace[len(first) + len(pair):]
    assert {mb for _, mb, layer in rest if layer >= 0} == {1}, "only micro-batch 1's backward runs alone last"
    assert [layer for n, _, layer in rest if n == "pre_backward"] == list(range(num_layers))[::-1]


@pytest.mark.parametrize("schedule", ["none", "chunked"])
def test_delayed_wgrad_without_1f1b_is_the_validator_rule(schedule):
    with pytest.raises(StepConfigError) as err:
        check_step_options(schedule, True, 1, 2)
    assert err.value.rule_id == "wgrad-requires-overlap"
    assert isinstance(err.value, ValueError) and "1f1b" in str(err.value)


def test_wgrad_rule_id_is_a_card_constraint():
    from moe_overlap.ep.step import WGRAD_RULE_ID
    from moe_overlap.skill.card.cards import load_card

    assert WGRAD_RULE_ID in {c.id for c in load_card().constraints}


def test_bad_schedule_and_chunks_name_the_field():
    with pytest.raises(StepConfigError, match="schedule"):
        check_step_options("2f2b", False, 1, 2)
    with pytest.raises(StepConfigError, match="chunks"):
        check_step_options("chunked", False, 0, 2)
    with pytest.raises(StepConfigError, match="batches"):
        check_step_options("1f1b", False, 1, 0)
