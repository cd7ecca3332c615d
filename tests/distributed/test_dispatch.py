"""Dispatcher on 1, 2 and 4 gloo ranks: exact rows received, exact inverse, gradients, async a2a."""

import pytest
import torch

from tests.distributed._spawn import run_ranks

E, D, K = 8, 4, 2


def _case(rank, case):
    """Rank-marked tokens and a routing every rank can regenerate for every other rank."""
    g = torch.Generator().manual_seed(100 * case + rank)
    t = {0: 6, 1: 5 if rank else 0, 2: 3}[case]  # case 1: rank 0 has no token at all
    x = torch.zeros(t, D)
    x[:, 0] = rank
    x[:, 1] = torch.arange(t, dtype=torch.float)
    x[:, 2:] = torch.randn(t, D - 2, generator=g)
    if case == 2:  # skewed: every token goes to experts 0 and 1 (all other experts get none)
        experts = torch.tensor([[0, 1]] * t)
    else:
        experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)]) if t else \
            torch.zeros(0, K, dtype=torch.int64)
    probs = torch.rand(t, K, generator=g)
    return x, experts, probs


def _dispatch_body(rank, world, group):
    from moe_overlap.ep.all_to_all import all_to_all_async
    from moe_overlap.ep.dispatcher import combine, dispatch
    from moe_overlap.ep.router import Routing

    local = E // world
    report = []
    for case in range(3):
        x, experts, probs = _case(rank, case)
        x = x.requires_grad_()
        probs = probs.requires_grad_()
        routing = Routing(probs, experts, torch.zeros(()), torch.zeros(()))
        recv, per_expert, handle = dispatch(x, routing, num_experts=E, group=group)
        # Expected rows: for each local expert, each source rank in order, its tokens in token order.
        want, want_counts = [], []
        for j in range(local):
            e = rank * local + j
            n = 0
            for s in range(world):
                xs, es, _ = _case(s, case)
                rows = [xs[t] for t in range(xs.shape[0]) if e in es[t].tolist()]
                want += rows
                n += len(rows)
            want_counts.append(n)
        want = torch.stack(want) if want else torch.zeros(0, D)
        assert torch.equal(recv.detach(), want), (case, recv, want)
        assert per_expert == tuple(want_counts)
        # Experts that multiply by (global id + 1): combine must give sum_k p_k (e_k + 1) x.
        scale = torch.cat([torch.full((c, 1), rank * local + j + 1.0) for j, c in enumerate(per_expert)])
        y = recv * scale
        # One rank: the weights travel with the rows to the experts, which apply them (the combine only sums).
        assert (handle.probs_S is not None) == (world == 1) and (handle.probs_TK is None) == (world == 1)
        if handle.probs_S is not None:
            want_p = torch.cat([probs.detach()[experts == e] for e in range(E)])  # expert-major, token order
            assert torch.equal(handle.probs_S.detach(), want_p)
            y = y * handle.probs_S.unsqueeze(1)
        out = combine(y, handle)
        factor = (probs.detach() * (experts + 1).float()).sum(-1, keepdim=True)
        torch.testing.assert_close(out, factor * x.detach(), rtol=1e-6, atol=1e-6)
        out.sum().backward()
        torch.testing.assert_close(x.grad, factor.expand(-1, D), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(probs.grad, x.detach().sum(-1, keepdim=True) * (experts + 1).float(),
                                   rtol=1e-6, atol=1e-6)
        report.append(case)
    # Async a2a with uneven and empty splits: rank r sends r+s rows to rank s, each row marked.
    send = torch.cat([torch.full((rank + s, 3), float(10 * rank + s)) for s in range(world)])
    h = all_to_all_async(send, [s + rank for s in range(world)], [rank + s for s in range(world)], group)
    got = h.wait()
    want = torch.cat([torch.full((s + rank, 3), float(10 * s + rank)) for s in range(world)])
    assert torch.equal(got, want)
    return report


@pytest.mark.parametrize("world", [1, 2, 4])
def test_dispatch_combine_exact(world):
    assert run_ranks(_dispatch_body, world, timeout=120) == [[0, 1, 2]] * world


def _bad_body(rank, world, group):
    from moe_overlap.ep.counts import exchange_counts

    try:
        exchange_counts(torch.zeros(1, 3, dtype=torch.int64), 3, group)
    except ValueError as err:
        return str(err)
    return "no error"


def test_experts_not_divisible_by_ep_size():
    assert run_ranks(_bad_body, 2, timeout=60) == ["num_experts=3 is not divisible by the EP size 2"] * 2


# ---------------------------------------------------------------- the spawn helper itself
def _hang_body(rank, world, group):
    import time

    if rank == 1:
        time.sleep(600)
    return rank


def _raise_body(rank, world, group):
    if rank == 0:
        raise KeyError("rank zero broke")
    return rank


def test_spawn_helper_turns_a_hang_into_a_failure():
    import time

    from tests.distributed._spawn import RankError, RankTimeout

    t0 = time.monotonic()
    with pytest.raises(RankTimeout, match=r"ranks \[1\] did not finish"):
        run_ranks(_hang_body, 2, timeout=8)
    assert time.monotonic() - t0 < 30
    with pytest.raises(RankError, match="rank zero broke"):
        run_ranks(_raise_body, 2, timeout=60)
