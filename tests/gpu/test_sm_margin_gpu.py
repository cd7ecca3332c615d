"""The expert GEMMs under an SM margin (ep/sm_margin.py) on CUDA: same bits, fewer SMs, restored after."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_grouped_gemms_are_bitwise_equal_under_any_margin():
    from moe_overlap.ep import sm_margin
    from moe_overlap.ep.experts import experts_dgrad, experts_forward, experts_wgrad

    if not sm_margin.available():
        pytest.skip("this torch has no SM carve-out")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    L, D, F = 8, 2048, 768
    counts = torch.tensor([700, 0, 1500, 300, 2048, 12, 999, 2635], device=dev)  # uneven, one empty
    S = int(counts.sum())
    x = torch.randn(S, D, device=dev, dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(S, D, device=dev, dtype=torch.bfloat16, generator=gen)
    w1 = torch.randn(L, D, 2 * F, device=dev, dtype=torch.bfloat16, generator=gen) * D ** -0.5
    w2 = torch.randn(L, F, D, device=dev, dtype=torch.bfloat16, generator=gen) * F ** -0.5

    def run():
        y, h = experts_forward(x, w1, w2, counts)
        dx, wgi, _ = experts_dgrad(dy, x, h, w1, w2, counts)
        dw1, dw2 = experts_wgrad(wgi, w1, w2, counts)
        return y, dx, dw1, dw2

    ref = run()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    before = torch._C._get_sm_carveout_experimental()
    for margin in (1, 16, 32, sms // 2):
        with sm_margin.gemm_sm_margin(margin, dev):
            assert torch._C._get_sm_carveout_experimental() == margin
            got = run()
        assert torch._C._get_sm_carveout_experimental() == before
        for name, a, b in zip(("y", "dx", "dw1", "dw2"), got, ref, strict=True):
            assert torch.equal(a, b), f"{name} differs under sm_margin={margin}"


@cuda
def test_margin_is_checked_against_the_device():
    from moe_overlap.ep.sm_margin import check_margin

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    assert check_margin(sms - 1, dev) == sms - 1
    with pytest.raises(ValueError, match="must be below"):
        check_margin(sms, dev)
