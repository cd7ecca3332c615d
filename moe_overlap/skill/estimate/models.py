"""Model presets for the estimator: MoE shapes from the models' public configs (torch-free).

``--model NAME`` fills hidden, moe_ffn, experts, topk and layers (values given explicitly win) and, when no
``attn_ms`` is given, the attention forward time: its FLOPs at the dense GEMM rate. Attention FLOPs per
micro-batch of T tokens in sequences of S:

    projections   2 x T x (attention weight elements)             (Q, K, V, O; or MLA's low-rank ones)
    core          2 x T x (S + 1) / 2 x heads x (qk_head_dim + v_head_dim)   (causal: half the scores)

Not modelled (stated in the estimate's assumptions): shared experts, the dense layers of DeepSeek-V3, MTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_overlap.skill.models.shapes import MODELS as SHAPES
from moe_overlap.skill.models.shapes import ModelShape


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hidden: int  # hidden_size
    moe_ffn: int  # moe_intermediate_size
    experts: int  # routed experts
    topk: int  # num_experts_per_tok
    layers: int  # MoE layers
    attn_weights: int  # attention projection weight elements per layer
    heads: int
    qk_head_dim: int
    v_head_dim: int
    source: str
    note: str = ""
    seq_length: int = 4096  # the sequence length of the card's anchor runs: estimate's default tokens (x mbs)
    shared_ffn: int = 0  # shared-expert FFN size (0: none); not modelled, named in the note

    def attn_fwd_flops(self, tokens: int, seq: int) -> float:
        proj = 2.0 * tokens * self.attn_weights
        core = 2.0 * tokens * (seq + 1) / 2 * self.heads * (self.qk_head_dim + self.v_head_dim)
        return proj + core


# What the estimator leaves out of each shape (the shapes themselves are moe_overlap.skill.models, shared with
# generate, so the two tools never describe one model two ways).
_NOT_MODELLED = {
    "deepseek-v3": "the shared expert (one per MoE layer) and the 3 dense layers are not modelled",
    "deepseek-v3-proxy": "one MoE layer, no attention",
    "qwen3-next-80b-a3b": "attention as full GQA on every layer (the model's 36 Gated DeltaNet layers cost less); "
                          "the shared expert is not modelled",
}


def _preset(m: ModelShape) -> ModelPreset:
    return ModelPreset(m.name, m.hidden_size, m.moe_ffn_hidden_size, m.num_moe_experts, m.moe_router_topk,
                       m.moe_layers, m.attention_weights(), m.num_attention_heads, m.qk_head_dim, m.v_head_dim,
                       m.source, note=_NOT_MODELLED.get(m.name, ""),
                       shared_ffn=m.moe_shared_expert_intermediate_size or 0)


MODELS: dict[str, ModelPreset] = {name: _preset(m) for name, m in SHAPES.items()}


class UnknownModel(ValueError):
    def __init__(self, name: str) -> None:
        self.choices = sorted(MODELS)
        super().__init__(f"unknown model preset {name!r}; choose one of {', '.join(self.choices)}")


def model_preset(name: str) -> ModelPreset:
    key = name.strip().lower()
    if key not in MODELS:
        raise UnknownModel(name)
    return MODELS[key]
