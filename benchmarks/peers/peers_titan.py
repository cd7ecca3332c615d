"""torchtitan's MoE layer for benchmarks/peers/peers.py: built from its own configs, given our weights, sharded
over EP by its own ``Module.parallelize``. torchtitan is imported, never copied; this file only maps.

Shape legend: T tokens per rank, D hidden, F expert ffn, E global experts, L = E / R local experts, K top-k.

Weight layouts (the same SwiGLU expert, y = (silu(x W_gate) * (x W_up)) W_down):

    ours        experts.w1 [E, D, 2F]: columns [:F] gate, [F:] up;   experts.w2 [E, F, D]
    torchtitan  w1_EFD [E, F, D] (gate, used as x @ w1.T), w3_EFD [E, F, D] (up), w2_EDF [E, D, F] (down)
                (torchtitan.models.common.moe.GroupedExperts.forward: silu(x w1^T) * (x w3^T), then @ w2^T)
    router      both [E, D] (ours router.weight, theirs router.gate.weight)

Routing: torchtitan's own ``TokenChoiceTopKRouter.Config._debug_force_load_balance`` (what its trainer sets from
``debug.moe_force_load_balance``) assigns expert (t*K + k) % E to token t's k-th slot: the assignment of our
``force_balance=True``. Scores: softmax over the E logits, the K chosen ones renormalised (``route_norm=True``,
ours ``normalize=True``: Qwen3's norm_topk_prob). No expert bias (``load_balance_coeff=None``), no shared expert.

EP: ``ParallelDims(dp_shard=R, ep=R)`` (EP borrows the data-parallel ranks, each rank has its own T tokens, as
ours), ``set_moe_sharding_config(enable_ep=R > 1)``, ``MoE.parallelize``; dispatch is its "standard" backend
(``AllToAllTokenDispatcher``; at EP 1 it runs its local reorder). The forward and backward run inside its
``get_spmd_context`` (the trainer's wrapper; needed by the default ``spmd_types`` backend).
"""

from __future__ import annotations

import contextlib

import torch

GROUPED_EXPERTS_LAYOUT = ("w1_EFD", "w2_EDF", "w3_EFD")
BACKENDS = ("spmd_types", "partial_dtensor")  # torchtitan 0.3.0's default first


def import_error() -> str | None:
    """None when torchtitan's MoE and EP sharding import here, else why not (one line)."""
    try:
        import torchtitan.models.common.moe  # noqa: F401
        import torchtitan.models.common.moe_sharding  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, never raised
        return f"{type(exc).__name__}: {exc}"
    return None


# ------------------------------------------------------------------ layouts (torch only, tested without torchtitan)
def ours_to_titan(w1_LD2F: torch.Tensor, w2_LFD: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our expert weights -> torchtitan's GroupedExperts tensors (same experts, contiguous copies)."""
    ffn = w2_LFD.shape[1]
    if w1_LD2F.shape[-1] != 2 * ffn:
        raise ValueError(f"w1 {tuple(w1_LD2F.shape)} and w2 {tuple(w2_LFD.shape)}: w1's last dim must be 2*F")
    return {"w1_EFD": w1_LD2F[..., :ffn].transpose(-2, -1).contiguous(),
            "w3_EFD": w1_LD2F[..., ffn:].transpose(-2, -1).contiguous(),
            "w2_EDF": w2_LFD.transpose(-2, -1).contiguous()}


def titan_to_ours(w1_EFD: torch.Tensor, w3_EFD: torch.Tensor, w2_EDF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchtitan's expert tensors (or their gradients) -> ours: (w1 [L, D, 2F], w2 [L, F, D])."""
    w1 = torch.cat([w1_EFD.transpose(-2, -1), w3_EFD.transpose(-2, -1)], dim=-1)
    return w1, w2_EDF.transpose(-2, -1)


def titan_expert_math(x_SD: torch.Tensor, w1_FD: torch.Tensor, w3_FD: torch.Tensor, w2_DF: torch.Tensor):
    """One expert as torchtitan's GroupedExperts computes it (for the layout test)."""
    return (torch.nn.functional.silu(x_SD @ w1_FD.t()) * (x_SD @ w3_FD.t())) @ w2_DF.t()


# ------------------------------------------------------------------ the module
def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor (DTensor under partial_dtensor, a plain annotated tensor under spmd_types)."""
    return t.to_local() if hasattr(t, "to_local") else t


class TitanMoE:
    """torchtitan's MoE on this rank; call it with x [T, D] -> out [T, D]."""

    def __init__(self, shape: dict, rank: int, world: int, device: torch.device, dtype: torch.dtype,
                 backend: str = BACKENDS[0]):
        import spmd_types as spmd
        import torchtitan.distributed.parallel_dims as pdims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.models.common.linear import Linear
        from torchtitan.models.common.moe import GroupedExperts as TitanExperts
        from torchtitan.models.common.moe import MoE, RoutedExperts, TokenChoiceTopKRouter
        from torchtitan.models.common.moe_sharding import set_moe_sharding_config
        from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

        if backend not in BACKENDS:
            raise ValueError(f"torchtitan backend {backend!r}: must be one of {BACKENDS}")
        D, F, E, K = shape["hidden"], shape["ffn"], shape["experts"], shape["topk"]
        self.notes: list[str] = []
        if device.type == "cpu" and pdims.device_type != "cpu":
            # torchtitan.tools.utils.device_type falls back to "cuda" without an accelerator; its mesh would
            # then ask for CUDA. Only the CPU smoke run takes this branch.
            pdims.device_type = "cpu"
            self.notes.append("CPU run: torchtitan.distributed.parallel_dims.device_type set to 'cpu' "
                              "(it defaults to 'cuda' when no accelerator is found)")
        cfg = MoE.Config(
            num_experts=E, load_balance_coeff=None,
            router=TokenChoiceTopKRouter.Config(
                num_experts=E, gate=Linear.Config(in_features=D, out_features=E, bias=False), top_k=K,
                score_func="softmax", route_norm=True, _debug_force_load_balance=True),
            routed_experts=RoutedExperts.Config(
                inner_experts=TitanExperts.Config(dim=D, hidden_dim=F, num_experts=E),
                token_dispatcher=AllToAllTokenDispatcher.Config(num_experts=E, top_k=K)))
        set_moe_sharding_config(cfg, enable_ep=world > 1, enable_sp=False,
                                expert_param_layout={"w1_EFD": spmd.S(1), "w2_EDF": spmd.S(2),
                                                     "w3_EFD": spmd.S(1)})

        def build():
            with torch.device(device):
                module = cfg.build()
            module.to(dtype)
            module.tokens_per_expert_E.data = module.tokens_per_expert_E.data.float()  # a counter, kept fp32
            return module.train()

        self.module = build()
        try:
            dist_utils.set_spmd_backend(backend)
            self.dims = pdims.ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=world,
                                           world_size=world, spmd_backend=backend)
            self.dims.build_mesh()
            self._context = dist_utils.get_spmd_context(parallel_dims=self.dims)
            with self._context():
                self.module.parallelize(self.dims)
        except Exception as exc:
            if world > 1:
                raise
            # At EP 1 torchtitan's own partial_dtensor path never parallelizes (parallelize_qwen3 calls it only
            # when tp or ep > 1): the same module, unwrapped, is what that path runs.
            self.notes.append(f"EP 1: its {backend} mesh/parallelize failed ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); ran the MoE unparallelized, as its partial_dtensor path does "
                              "at EP 1")
            dist_utils.set_spmd_backend("partial_dtensor")
            self.dims, self._context = None, contextlib.nullcontext
            self.module = build()
        module = self.module
        self.experts = module.routed_experts.inner_experts
        self.local_experts = _local(self.experts.w1_EFD).shape[0]
        if self.local_experts * world != E:
            raise RuntimeError(f"torchtitan sharded {E} experts into {self.local_experts} per rank on {world} ranks")
        self.rank, self.world = rank, world

    def load(self, router_ED: torch.Tensor, w1_LD2F: torch.Tensor, w2_LFD: torch.Tensor) -> None:
        """Our router weight and THIS rank's local experts (global experts rank*L .. rank*L + L - 1)."""
        mapped = ours_to_titan(w1_LD2F, w2_LFD)
        with torch.no_grad():
            _local(self.module.router.gate.weight).copy_(router_ED)
            for name in GROUPED_EXPERTS_LAYOUT:
                _local(getattr(self.experts, name)).copy_(mapped[name])

    def __call__(self, x_TD: torch.Tensor) -> torch.Tensor:
        with self._context():
            return self.module(x_TD.unsqueeze(0)).squeeze(0)

    def backward(self, out_TD: torch.Tensor, grad_TD: torch.Tensor) -> None:
        with self._context():
            out_TD.backward(grad_TD)

    def zero_grad(self) -> None:
        self.module.zero_grad(set_to_none=True)

    def grads(self) -> dict[str, torch.Tensor]:
        """Local gradients in our layout: router.weight [E, D], experts.w1 [L, D, 2F], experts.w2 [L, F, D]."""
        e = self.experts
        w1, w2 = titan_to_ours(*(_local(getattr(e, n).grad) for n in ("w1_EFD", "w3_EFD", "w2_EDF")))
        return {"router.weight": _local(self.module.router.gate.weight.grad), "experts.w1": w1, "experts.w2": w2}

    def describe(self) -> dict:
        return {"module": "torchtitan.models.common.moe.MoE", "experts": "GroupedExperts (torch._grouped_mm)",
                "dispatcher": "AllToAllTokenDispatcher (comm_backend 'standard')",
                "spmd_backend": self.dims.spmd_backend if self.dims else "none (unparallelized, EP 1)",
                "parallel_dims": {"dp_shard": self.world, "ep": self.world} if self.dims else None,
                "routing": "_debug_force_load_balance=True, softmax, route_norm=True, load_balance_coeff=None",
                "dtype": str(self.experts.w1_EFD.dtype).replace("torch.", "")}
