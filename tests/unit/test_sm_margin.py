"""ep/sm_margin.py: the margin is validated, applied only on CUDA, and always restored."""

from __future__ import annotations

import pytest
import torch

from moe_overlap.ep import sm_margin


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_margin_names_the_field(bad):
    with pytest.raises(ValueError, match=r"sm_margin=.*int >= 0"):
        sm_margin.check_margin(bad)


def test_good_margin_passes():
    assert sm_margin.check_margin(0) == 0
    assert sm_margin.check_margin(24, torch.device("cpu")) == 24


def test_cpu_and_zero_leave_the_setting_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._C, "_set_sm_carveout_experimental", calls.append, raising=False)
    with sm_margin.gemm_sm_margin(16, torch.device("cpu")):
        pass
    with sm_margin.gemm_sm_margin(0, torch.device("cuda")):
        pass
    with sm_margin.gemm_sm_margin(16, None):
        pass
    assert calls == []


def test_cuda_margin_is_set_and_restored_even_on_error(monkeypatch):
    state = {"v": 4}
    monkeypatch.setattr(torch._C, "_set_sm_carveout_experimental", lambda v: state.update(v=v), raising=False)
    monkeypatch.setattr(torch._C, "_get_sm_carveout_experimental", lambda: state["v"], raising=False)
    with pytest.raises(RuntimeError, match="boom"):
        with sm_margin.gemm_sm_margin(32, torch.device("cuda")):
            assert state["v"] == 32
            raise RuntimeError("boom")
    assert state["v"] == 4


def test_torch_without_carveout_is_a_no_op(monkeypatch):
    monkeypatch.delattr(torch._C, "_set_sm_carveout_experimental", raising=False)
    assert not sm_margin.available()
    with sm_margin.gemm_sm_margin(32, torch.device("cuda")):
        pass


CUDA = torch.device("cuda")


@pytest.mark.parametrize("kw,margin,word", [
    (dict(device=torch.device("cpu"), nccl_all_to_all=True, network=True, world=2), 0, "no SM-driven"),
    (dict(device=CUDA, nccl_all_to_all=True, network=True, world=1), 0, "no SM-driven"),
    (dict(device=CUDA, nccl_all_to_all=False, network=False, world=2), 0, "copy-engine"),
    (dict(device=CUDA, nccl_all_to_all=True, network=False, world=2), 0, "NVLink"),
    (dict(device=CUDA, nccl_all_to_all=True, network=True, world=8), sm_margin.NETWORK_MARGIN, "network"),
])
def test_auto_margin_follows_the_all_to_all(kw, margin, word):
    got, why = sm_margin.resolve_margin("auto", **kw)
    assert got == margin and word in why and why.startswith(f"{margin} (auto")


def test_asked_margin_is_kept_and_checked():
    assert sm_margin.resolve_margin(24, device=torch.device("cpu"), nccl_all_to_all=False, network=False,
                                    world=2) == (24, "24 (asked)")
    with pytest.raises(ValueError, match="sm_margin"):
        sm_margin.resolve_margin(-2, device=torch.device("cpu"), nccl_all_to_all=True, network=True, world=2)
