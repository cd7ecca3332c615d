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

HF = "https://huggingface.co/{}/blob/main/config.json"


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


def _gqa(hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Q and O are heads x head_dim wide, K and V kv_heads x head_dim."""
    return hidden * head_dim * (2 * heads + 2 * kv_heads)


def _mla(hidden: int, heads: int, q_rank: int, kv_rank: int, nope: int, rope: int, v: int) -> int:
    """DeepSeek's multi-head latent attention: q_a, q_b, kv_a (latent + rope key), kv_b, o."""
    return (hidden * q_rank + q_rank * heads * (nope + rope) + hidden * (kv_rank + rope)
            + kv_rank * heads * (nope + v) + heads * v * hidden)


MODELS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("qwen3-30b-a3b", 2048, 768, 128, 8, 48, _gqa(2048, 32, 4, 128), 32, 128, 128,
                    HF.format("Qwen/Qwen3-30B-A3B") + " (hidden_size 2048, moe_intermediate_size 768, num_experts "
                    "128, num_experts_per_tok 8, num_hidden_layers 48, 32 heads / 4 KV heads of head_dim 128)"),
        ModelPreset("qwen3-235b-a22b", 4096, 1536, 128, 8, 94, _gqa(4096, 64, 4, 128), 64, 128, 128,
                    HF.format("Qwen/Qwen3-235B-A22B") + " (hidden_size 4096, moe_intermediate_size 1536, "
                    "num_experts 128, num_experts_per_tok 8, num_hidden_layers 94, 64 heads / 4 KV heads of 128)"),
        ModelPreset("deepseek-v3", 7168, 2048, 256, 8, 58, _mla(7168, 128, 1536, 512, 128, 64, 128), 128, 192, 128,
                    HF.format("deepseek-ai/DeepSeek-V3") + " (hidden_size 7168, moe_intermediate_size 2048, "
                    "n_routed_experts 256, num_experts_per_tok 8, 61 layers of which first_k_dense_replace 3 dense, "
                    "MLA: 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk 128+64, v 128)",
                    note="the shared expert (one per MoE layer) and the 3 dense layers are not modelled"),
        ModelPreset("deepseek-v3-proxy", 7168, 2048, 32, 8, 1, 0, 0, 0, 0,
                    "Megatron-LM moe_perf single-layer baseline shape (DeepSeek-V3 proxy: hidden 7168, ffn 2048, "
                    "32 experts, top-8, 4096 tokens; the MoE layer alone)",
                    note="one MoE layer, no attention"),
        ModelPreset("qwen3-next-80b-a3b", 2048, 512, 512, 10, 48, _gqa(2048, 16, 2, 256), 16, 256, 256,
                    HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct") + " (hidden_size 2048, moe_intermediate_size 512, "
                    "num_experts 512, num_experts_per_tok 10, num_hidden_layers 48, 16 heads / 2 KV heads of "
                    "head_dim 256, shared_expert_intermediate_size 512; the same values in Megatron-Bridge's "
                    "tests/unit_tests/models/qwen/test_qwen3_next_bridge.py)",
                    note="attention as full GQA on every layer (the model's 36 Gated DeltaNet layers cost less); "
                    "the shared expert is not modelled", shared_ffn=512),
        ModelPreset("mixtral-8x7b", 4096, 14336, 8, 2, 32, _gqa(4096, 32, 8, 128), 32, 128, 128,
                    HF.format("mistralai/Mixtral-8x7B-v0.1") + " (hidden_size 4096, intermediate_size 14336, "
                    "num_local_experts 8, num_experts_per_tok 2, num_hidden_layers 32, 32 heads / 8 KV heads)"),
    )
}


class UnknownModel(ValueError):
    def __init__(self, name: str) -> None:
        self.choices = sorted(MODELS)
        super().__init__(f"unknown model preset {name!r}; choose one of {', '.join(self.choices)}")


def model_preset(name: str) -> ModelPreset:
    key = name.strip().lower()
    if key not in MODELS:
        raise UnknownModel(name)
    return MODELS[key]
