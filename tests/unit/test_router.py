"""Router math, forced balance, auxiliary losses and input errors (moe_overlap.ep.router)."""

import math

import pytest
import torch

from moe_overlap.ep.router import attach_aux_losses, balanced_assignment, route


def _data(t=12, d=8, e=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, d, generator=g), torch.randn(e, d, generator=g)


def test_softmax_topk_matches_manual():
    x, w = _data()
    r = route(x, w, topk=2)
    scores = torch.softmax(x @ w.t(), -1)
    top = scores.topk(2, -1)
    assert torch.equal(r.experts_TK, top.indices)
    torch.testing.assert_close(r.probs_TK, top.values)
    rn = route(x, w, topk=2, normalize=True)
    torch.testing.assert_close(rn.probs_TK, top.values / top.values.sum(-1, keepdim=True))


def test_sigmoid_is_normalised_by_default():
    x, w = _data()
    r = route(x, w, topk=3, score="sigmoid")
    torch.testing.assert_close(r.probs_TK.sum(-1), torch.ones(12))
    s = torch.sigmoid(x @ w.t())
    assert torch.equal(r.experts_TK, s.topk(3, -1).indices)


@pytest.mark.parametrize("t,k,e", [(12, 2, 6), (7, 3, 4), (5, 4, 4), (1, 1, 8)])
def test_force_balance_is_balanced_and_distinct(t, k, e):
    x, w = _data(t=t, e=e)
    r = route(x, w, topk=k, force_balance=True)
    counts = torch.bincount(r.experts_TK.reshape(-1), minlength=e)
    assert int(counts.max() - counts.min()) <= 1
    assert all(len(set(row.tolist())) == k for row in r.experts_TK)
    assert torch.equal(r.experts_TK, balanced_assignment(t, k, e, "cpu"))


def test_aux_and_z_loss_values():
    x, _ = _data(t=12, e=4)
    w = torch.zeros(4, 8)  # uniform scores, logits 0
    r = route(x, w, topk=2, force_balance=True)
    # uniform scores and perfectly balanced load: E * sum_e (1/E)(1/E) = 1
    torch.testing.assert_close(r.aux_loss, torch.tensor(1.0))
    torch.testing.assert_close(r.z_loss, torch.tensor(math.log(4) ** 2))
    # all tokens on one expert pair with skewed scores: aux > 1
    x2, w2 = _data(t=12, e=4)
    w2[0] += 10 * x2.mean(0)
    assert route(x2, w2, topk=1).aux_loss > 1.0


def test_attached_aux_loss_reaches_router_gradient():
    x, w = _data()
    w = w.requires_grad_()
    r = route(x, w, topk=2)
    out = attach_aux_losses(x * 1.0, r, aux_coeff=0.5, z_coeff=0.0)
    out.sum().backward()
    got = w.grad.clone()
    w.grad = None
    r2 = route(x, w, topk=2)
    (0.5 * r2.aux_loss).backward()
    torch.testing.assert_close(got, w.grad)


def test_zero_tokens_is_normal():
    x, w = _data(t=0)
    r = route(x, w, topk=2)
    assert r.experts_TK.shape == (0, 2) and float(r.aux_loss) == 0.0


@pytest.mark.parametrize("kwargs,needle", [
    ({"topk": 0}, "topk=0"), ({"topk": 7}, "topk=7"), ({"topk": 2, "score": "relu"}, "score='relu'"),
])
def test_bad_input_names_the_parameter(kwargs, needle):
    x, w = _data()
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        route(x, w, **kwargs)


def test_hidden_mismatch():
    x, w = _data()
    with pytest.raises(ValueError, match="hidden size 8 != router weight hidden size 5"):
        route(x, w[:, :5], topk=1)
