"""The shapes of public MoE models under Megatron-Core's field names, each from its published config.

Torch-free. Values are the Hugging Face ``config.json`` fields, renamed the way Megatron-Bridge's converter does
(``CONFIG_MAPPING`` in megatron/bridge/models/conversion/model_bridge.py of the 0.6.2 wheel, plus the model
bridges' own lines):

    num_layers                  <- num_hidden_layers
    hidden_size                 <- hidden_size
    ffn_hidden_size             <- intermediate_size (the dense FFN: DeepSeek-V3's first layers; unused where
                                   every layer is MoE, written anyway, as Bridge does)
    num_attention_heads         <- num_attention_heads
    num_query_groups            <- num_key_value_heads (GQA)
    kv_channels                 <- head_dim
    moe_ffn_hidden_size         <- moe_intermediate_size (Mixtral: intermediate_size, every FFN is an expert)
    num_moe_experts             <- num_experts / n_routed_experts / num_local_experts
    moe_router_topk             <- num_experts_per_tok
    moe_shared_expert_intermediate_size <- n_shared_experts x moe_intermediate_size (DeepSeek-V3 bridge);
                                   shared_expert_intermediate_size (Qwen3-Next bridge)
    moe_layer_freq              <- [0] x first_k_dense_replace + [1] x the rest (DeepSeek-V3 bridge)
    mtp_num_layers              <- num_nextn_predict_layers
    q_lora_rank, kv_lora_rank, qk_head_dim (<- qk_nope_head_dim), qk_pos_emb_head_dim (<- qk_rope_head_dim),
    v_head_dim                  (multi-latent attention)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HF = "https://huggingface.co/{}/blob/main/config.json"


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-latent attention dimensions (MLATransformerConfig fields)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_moe_experts: int
    moe_router_topk: int
    moe_ffn_hidden_size: int
    vocab_size: int
    source: str
    num_query_groups: int | None = None  # GQA; None with MLA
    kv_channels: int | None = None
    mla: MLA | None = None
    moe_shared_expert_intermediate_size: int | None = None
    first_dense_layers: int = 0
    mtp_num_layers: int | None = None
    layer_only: bool = False  # a single-MoE-layer benchmark shape, not a model
    note: str = ""

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    def moe_layer_freq(self) -> list[int] | None:
        """Megatron's per-layer MoE pattern (1 = MoE), or None when every layer is MoE (Megatron's default 1)."""
        if not self.first_dense_layers:
            return None
        return [0] * self.first_dense_layers + [1] * self.moe_layers

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head (MLA: the no-position part plus the rotary part)."""
        return self.mla.qk_head_dim + self.mla.qk_pos_emb_head_dim if self.mla else (self.kv_channels or 0)

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else (self.kv_channels or 0)

    def attention_weights(self) -> int:
        """Attention projection weight elements per layer (Q, K, V, O; or MLA's low-rank ones)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla:
            m = self.mla
            return (h * m.q_lora_rank + m.q_lora_rank * heads * (m.qk_head_dim + m.qk_pos_emb_head_dim)
                    + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank * heads * (m.qk_head_dim
                    + m.v_head_dim) + heads * m.v_head_dim * h)
        if not heads or not self.kv_channels:
            return 0
        return h * self.kv_channels * (2 * heads + 2 * (self.num_query_groups or heads))

    def megatron_fields(self) -> dict[str, Any]:
        """The ``model:`` keys of this shape, in the order a recipe lists them (MTP and layout are the caller's)."""
        out: dict[str, Any] = {"num_layers": self.num_layers, "hidden_size": self.hidden_size,
                               "ffn_hidden_size": self.ffn_hidden_size,
                               "num_attention_heads": self.num_attention_heads}
        if self.mla:
            out["multi_latent_attention"] = True
            out.update(vars(self.mla))
        else:
            if self.num_query_groups and self.num_query_groups != self.num_attention_heads:
                out["num_query_groups"] = self.num_query_groups
            if self.kv_channels:
                out["kv_channels"] = self.kv_channels
        out["moe_ffn_hidden_size"] = self.moe_ffn_hidden_size
        out["moe_router_topk"] = self.moe_router_topk
        if self.moe_shared_expert_intermediate_size:
            out["moe_shared_expert_intermediate_size"] = self.moe_shared_expert_intermediate_size
        if (freq := self.moe_layer_freq()) is not None:
            out["moe_layer_freq"] = freq
        return out


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("qwen3-30b-a3b", num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                   num_query_groups=4, kv_channels=128, num_moe_experts=128, moe_router_topk=8,
                   moe_ffn_hidden_size=768, vocab_size=151936, source=HF.format("Qwen/Qwen3-30B-A3B"),
                   note="every layer is MoE (decoder_sparse_step 1, mlp_only_layers []); no shared expert"),
        ModelShape("qwen3-235b-a22b", num_layers=94, hidden_size=4096, ffn_hidden_size=12288,
                   num_attention_heads=64, num_query_groups=4, kv_channels=128, num_moe_experts=128,
                   moe_router_topk=8, moe_ffn_hidden_size=1536, vocab_size=151936,
                   source=HF.format("Qwen/Qwen3-235B-A22B"), note="every layer is MoE; no shared expert"),
        ModelShape("qwen3-next-80b-a3b", num_layers=48, hidden_size=2048, ffn_hidden_size=5120,
                   num_attention_heads=16, num_query_groups=2, kv_channels=256, num_moe_experts=512,
                   moe_router_topk=10, moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512,
                   mtp_num_layers=1, vocab_size=151936, source=HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct"),
                   note="hybrid attention: gated attention every 4th layer (the GQA shape here), Gated DeltaNet "
                        "linear attention in the others (full_attention_interval 4), which needs Megatron-Bridge's "
                        "Qwen3-Next provider (experimental_attention_variant gated_delta_net); MTP 1 as in "
                        "Bridge 0.6.2's qwen3_next recipe"),
        ModelShape("deepseek-v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
                   mla=MLA(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                           v_head_dim=128),
                   num_moe_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                   moe_shared_expert_intermediate_size=2048, first_dense_layers=3, mtp_num_layers=1,
                   vocab_size=129280, source=HF.format("deepseek-ai/DeepSeek-V3"),
                   note="n_shared_experts 1 x moe_intermediate_size 2048; first_k_dense_replace 3 (dense FFN "
                        "18432); num_nextn_predict_layers 1 (MTP); MLA attention"),
        ModelShape("mixtral-8x7b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                   num_query_groups=8, kv_channels=128, num_moe_experts=8, moe_router_topk=2,
                   moe_ffn_hidden_size=14336, vocab_size=32000, source=HF.format("mistralai/Mixtral-8x7B-v0.1"),
                   note="num_local_experts 8, num_experts_per_tok 2; every FFN (intermediate_size 14336) is an "
                        "expert"),
        ModelShape("deepseek-v3-proxy", num_layers=1, hidden_size=7168, ffn_hidden_size=2048,
                   num_attention_heads=0, num_moe_experts=32, moe_router_topk=8, moe_ffn_hidden_size=2048,
                   vocab_size=0, layer_only=True,
                   source="Megatron-LM moe_perf single-layer baseline shape (DeepSeek-V3 proxy: hidden 7168, ffn "
                          "2048, 32 experts, top-8, 4096 tokens; the MoE layer alone)",
                   note="one MoE layer, no attention: a benchmark shape for estimate, not a model to train"),
    )
}


class UnknownModel(ValueError):
    """Unknown model name; names the field and the valid choices."""

    def __init__(self, name: str, *, field: str = "model", trainable_only: bool = False):
        self.field = field
        self.choices = sorted(n for n, m in MODELS.items() if not (trainable_only and m.layer_only))
        super().__init__(f"{field}: unknown model {name!r}; choose one of {', '.join(self.choices)}")


def get_model(name: str, *, trainable_only: bool = False) -> ModelShape:
    key = name.strip().lower()
    if key not in MODELS or (trainable_only and MODELS[key].layer_only):
        raise UnknownModel(name, trainable_only=trainable_only)
    return MODELS[key]
