"""Megatron-Core's MoE layer for benchmarks/peers/peers.py (CUDA only: its alltoall dispatcher and router need a GPU).

Experts: ``GroupedMLP`` (the legacy grouped path; needs the ``grouped_gemm`` CUDA extension) when that imports,
else ``SequentialMLP`` (a per-expert loop, what Megatron-Core runs without grouped_gemm or Transformer
Engine). TEGroupedMLP needs Transformer Engine, which is not installable on the device machine.

Weight layouts (the same SwiGLU expert; Megatron's glu: ``chunk(fc1_out, 2)``, silu of the first half):

    GroupedMLP      weight1 [D, L*2F] viewed as [L, D, 2F] (its forward: ``weight1.view(L, D, -1)``) = our w1
                    weight2 [L*F, D] viewed as [L, F, D] = our w2
    SequentialMLP   local_experts[j].linear_fc1.weight [2F, D] = w1[j].T; linear_fc2.weight [D, F] = w2[j].T

Routing: Megatron's ``moe_router_force_load_balancing`` draws random logits, which would route differently from
ours; instead the router's top-k step (``TopKRouter.routing``) is replaced on the instance by the same balanced
assignment, (t*K + k) % E, with softmax scores renormalised over the K chosen experts (what its
``use_pre_softmax=False`` top-k computes). Its gating GEMM (fp32), dispatcher and experts are its own.
"""

from __future__ import annotations

import torch

MODES = ("auto", "grouped", "sequential", "off")


def grouped_gemm_error() -> str | None:
    """None when the grouped_gemm extension imports, else why not."""
    try:
        import grouped_gemm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def balanced_routing(num_experts: int, topk: int):
    """A drop-in for ``TopKRouter.routing``: (probs [T, E] fp32, routing_map [T, E] bool), balanced."""
    def routing(logits: torch.Tensor, padding_mask=None):
        logits_TE = logits.reshape(-1, num_experts)
        n = logits_TE.shape[0]
        experts_TK = (torch.arange(n * topk, device=logits.device) % num_experts).view(n, topk)
        probs_TK = torch.softmax(logits_TE.float(), dim=-1).gather(1, experts_TK)
        probs_TK = probs_TK / (probs_TK.sum(-1, keepdim=True) + 1e-20)
        probs_TE = torch.zeros_like(logits_TE, dtype=torch.float32).scatter(1, experts_TK, probs_TK)
        routing_map = torch.zeros_like(logits_TE, dtype=torch.bool).scatter(1, experts_TK, True)
        return probs_TE, routing_map

    return routing


def grouped_views(w1_flat: torch.Tensor, w2_flat: torch.Tensor, local: int, hidden: int):
    """GroupedMLP's weight1 [D, L*2F] / weight2 [L*F, D] (or their grads) as ours: [L, D, 2F], [L, F, D]."""
    return w1_flat.view(local, hidden, -1), w2_flat.view(local, -1, hidden)


class MegatronMoE:
    """Megatron-Core's MoELayer (local spec, alltoall dispatcher) on this rank; x [T, D] -> out [T, D]."""

    def __init__(self, shape: dict, world: int, device: torch.device, dtype: torch.dtype, mode: str = "auto"):
        import megatron.core.transformer.moe.moe_utils as moe_utils
        import torch.nn.functional as Fn
        from megatron.core import parallel_state
        from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.transformer.transformer_config import TransformerConfig

        if device.type != "cuda":
            raise RuntimeError("Megatron-Core's MoE layer needs CUDA (its alltoall dispatcher makes CUDA streams)")
        if mode not in ("auto", "grouped", "sequential"):
            raise ValueError(f"megatron mode {mode!r}: must be auto, grouped or sequential")
        why_not = grouped_gemm_error()
        self.grouped = mode == "grouped" or (mode == "auto" and why_not is None)
        if self.grouped and why_not is not None:
            raise RuntimeError(f"GroupedMLP needs grouped_gemm: {why_not}")
        self.notes = [] if self.grouped else [f"GroupedMLP not used: grouped_gemm does not import ({why_not})"]
        # megatron-core 0.16.1 binds te_general_gemm only when Transformer Engine imports, but its router
        # reads the name unconditionally (NameError without TE); None selects its plain torch path.
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
            self.notes.append("moe_utils.te_general_gemm = None (megatron-core 0.16.1 reads it without TE)")
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=world)
            model_parallel_cuda_manual_seed(0)
        D, F, E, K = shape["hidden"], shape["ffn"], shape["experts"], shape["topk"]
        cfg = TransformerConfig(
            num_layers=1, hidden_size=D, num_attention_heads=16, ffn_hidden_size=F, moe_ffn_hidden_size=F,
            num_moe_experts=E, moe_router_topk=K, moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=self.grouped, expert_model_parallel_size=world, moe_aux_loss_coeff=0.0,
            moe_router_load_balancing_type="none", moe_router_score_function="softmax",
            moe_router_pre_softmax=False, bf16=dtype == torch.bfloat16, params_dtype=dtype,
            add_bias_linear=False, gated_linear_unit=True, activation_func=Fn.silu,
            gradient_accumulation_fusion=False, bias_activation_fusion=False, moe_router_dtype="fp32")
        spec = get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=self.grouped)
        self.layer = build_module(spec, config=cfg).to(device=device, dtype=dtype).train()
        self.layer.router.routing = balanced_routing(E, K)
        self.local_experts = E // world
        self.hidden = D

    def load(self, router_ED: torch.Tensor, w1_LD2F: torch.Tensor, w2_LFD: torch.Tensor) -> None:
        ex = self.layer.experts
        with torch.no_grad():
            self.layer.router.weight.copy_(router_ED)
            if self.grouped:
                w1, w2 = grouped_views(ex.weight1, ex.weight2, self.local_experts, self.hidden)
                w1.copy_(w1_LD2F)
                w2.copy_(w2_LFD)
            else:
                for j, mlp in enumerate(ex.local_experts):
                    mlp.linear_fc1.weight.copy_(w1_LD2F[j].t())
                    mlp.linear_fc2.weight.copy_(w2_LFD[j].t())

    def __call__(self, x_TD: torch.Tensor) -> torch.Tensor:
        out = self.layer(x_TD.unsqueeze(1))  # Megatron's [S, B, D]
        return (out[0] if isinstance(out, tuple) else out).squeeze(1)

    def backward(self, out_TD: torch.Tensor, grad_TD: torch.Tensor) -> None:
        out_TD.backward(grad_TD)

    def zero_grad(self) -> None:
        self.layer.zero_grad(set_to_none=True)

    def grads(self) -> dict[str, torch.Tensor]:
        ex = self.layer.experts
        if self.grouped:
            w1, w2 = grouped_views(ex.weight1.grad, ex.weight2.grad, self.local_experts, self.hidden)
        else:
            w1 = torch.stack([m.linear_fc1.weight.grad.t() for m in ex.local_experts])
            w2 = torch.stack([m.linear_fc2.weight.grad.t() for m in ex.local_experts])
        return {"router.weight": self.layer.router.weight.grad, "experts.w1": w1, "experts.w2": w2}

    def describe(self) -> dict:
        return {"module": "megatron.core.transformer.moe.moe_layer.MoELayer (local spec, no TE)",
                "experts": type(self.layer.experts).__name__, "dispatcher": "alltoall",
                "routing": "TopKRouter.routing replaced by the balanced assignment (see peers_megatron.py)"}
