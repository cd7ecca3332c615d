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


def _train(cfg, group, rank, schedule, delay, micro_batches):
    from moe_overlap.ep.model import MoETransformer
    from moe_overlap.ep.step import forward_backward

    model = MoETransformer(cfg, group)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, grads, notes = [], None, []
    for step in range(STEPS):
        res = forward_backward(model, _batches(rank, step, cfg, micro_batches), schedule=schedule,
                               delay_wgrad=delay, chunks=1, group=group)
        losses.append(res.losses)
        notes += res.notes
        if step == 0:
            grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
    # numpy, not tensors: tensors cross the result queue through shared-memory fds that vanish
    # with the exiting child.
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params, "notes": notes}


def _body(rank, world, group, cfg_kwargs):
    from moe_overlap.ep.model import ModelConfig

    cfg = ModelConfig(**cfg_kwargs)
    out = {f"{s}+{d}": _train(cfg, group, rank, s, d, MICRO_BATCHES) for s, d in MODES}
    out["single"] = _train(cfg, group, rank, "1f1b", True, 1)
    out["single_ref"] = _train(cfg, group, rank, "none", False, 1)
    return out


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
    results = run_ranks(_body, world=world, args=(cfg,), timeout=150)
    for rank, res in enumerate(results):
        ref = res["none+False"]
        assert all(len(ls) == MICRO_BATCHES for ls in ref["losses"])
        assert ref["losses"][0] != ref["losses"][-1], "training did not move: the comparison would be vacuous"
        assert any(abs(g).sum() > 0 for n, g in ref["grads"].items() if "experts" in n)
        _assert_bitwise(ref, res["1f1b+False"], f"rank {rank} 1f1b")
        _assert_bitwise(ref, res["1f1b+True"], f"rank {rank} 1f1b+delayed wgrad")
        _assert_bitwise(res["single_ref"], res["single"], f"rank {rank} 1f1b with one micro-batch")
        assert any("single-micro-batch" in n for n in res["single"]["notes"])
        assert not res["1f1b+True"]["notes"]
    # Replicated parameters stay replicated (gradients are averaged over the group).
    for name, p in results[0]["1f1b+True"]["params"].items():
        if "experts" not in name:
            assert all((r["1f1b+True"]["params"][name] == p).all() for r in results[1:]), name


@pytest.mark.parametrize("schedule", ["none", "chunked"])
def test_delayed_wgrad_without_1f1b_is_the_validator_rule(schedule):
    with pytest.raises(StepConfigError) as err:
        check_step_options(schedule, True, 1, 2)
    assert err.value.rule_id == "wgrad-requires-overlap"
    assert isinstance(err.value, ValueError) and "1f1b" in str(err.value)


def test_bad_schedule_and_chunks_name_the_field():
    with pytest.raises(StepConfigError, match="schedule"):
        check_step_options("2f2b", False, 1, 2)
    with pytest.raises(StepConfigError, match="chunks"):
        check_step_options("chunked", False, 0, 2)
    with pytest.raises(StepConfigError, match="batches"):
        check_step_options("1f1b", False, 1, 0)
