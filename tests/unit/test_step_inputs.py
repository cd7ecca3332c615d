"""Input checks of the 1F1B step entry point and the split (dgrad/wgrad) linear used by attention."""

from __future__ import annotations

import pytest
import torch

from moe_overlap.ep.linear import split_linear
from moe_overlap.ep.step import StepConfigError, check_batches
from moe_overlap.ep.wgrad import WgradStore

CPU = torch.device("cpu")


def _pair(b=2, s=4, hi=10, dtype=torch.int64):
    t = torch.randint(0, hi, (b, s)).to(dtype)
    return t, t.roll(-1, 1)


def test_good_batches_pass():
    check_batches([_pair(), _pair()], vocab_size=10, device=CPU)


@pytest.mark.parametrize("bad, words", [
    ([(torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 5, dtype=torch.int64))], "shapes"),
    ([_pair(dtype=torch.int32)], "int64"),
    ([_pair(hi=50)], "vocab_size=10"),
    ([torch.zeros(2, 4, dtype=torch.int64)], "pair"),
])
def test_bad_batches_name_the_problem(bad, words):
    with pytest.raises(StepConfigError, match=words) as err:
        check_batches(bad, vocab_size=10, device=CPU)
    assert "batches[0]" in str(err.value)


def _grads(store):
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 5, generator=gen))
    x = torch.randn(3, 4, 5, generator=gen, requires_grad=True)
    dy = torch.randn(3, 4, 6, generator=gen)
    for _ in range(3):  # accumulate over three "micro-batches", like a step
        split_linear(x, w, store).backward(dy)
        if store is not None:
            assert store.pending == 1  # the weight gradient waits in the store, dgrad did not
            store.run_all()
    return x.grad, w.grad


def test_split_linear_delayed_wgrad_is_bitwise_the_immediate_one_and_correct():
    dx_now, dw_now = _grads(None)
    dx_late, dw_late = _grads(WgradStore())
    assert torch.equal(dx_now, dx_late) and torch.equal(dw_now, dw_late)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=gen, requires_grad=True)
    x = torch.randn(3, 4, 5, generator=gen, requires_grad=True)
    dy = torch.randn(3, 4, 6, generator=gen)
    for _ in range(3):
        torch.nn.functional.linear(x, w).backward(dy)
    torch.testing.assert_close(dw_now, w.grad)
    torch.testing.assert_close(dx_now, x.grad)
