"""Model presets for `generate`: the MoE dimensions of public models, each with where it comes from.

Torch-free. Values are the models' published Hugging Face ``config.json`` fields, renamed to Megatron's:

    hidden_size          <- hidden_size
    moe_ffn_hidden_size  <- moe_intermediate_size (Mixtral: intermediate_size, every FFN is an expert)
    num_moe_experts      <- num_experts / n_routed_experts / num_local_experts
    moe_router_topk      <- num_experts_per_tok
    num_layers           <- num_hidden_layers
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PresetError(ValueError):
    """Unknown preset name; names the field and the valid choices."""

    def __init__(self, name: str, choices: list[str]):
        self.field = "preset"
        self.choices = choices
        super().__init__(f"preset: unknown model preset {name!r}; choose one of {', '.join(choices)}")


class ModelPreset(BaseModel):
    """The MoE shape of one public model (Megatron field names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hidden_size: int = Field(gt=0)
    moe_ffn_hidden_size: int = Field(gt=0)
    num_moe_experts: int = Field(gt=1)
    moe_router_topk: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    moe_shared_expert_intermediate_size: int | None = None
    mtp_num_layers: int | None = None
    source: str
    notes: str = ""

    def model_fields_for_config(self) -> dict[str, int]:
        """The keys `generate` writes into ``model:`` for this preset (routing and size, not the layout).

        MTP is a training choice with its own EP-overlap rules (mtp-layers-limit, mtp-requires-pp): not written.
        """
        out = {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
            "moe_router_topk": self.moe_router_topk,
        }
        if self.moe_shared_expert_intermediate_size:
            out["moe_shared_expert_intermediate_size"] = self.moe_shared_expert_intermediate_size
        return out


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="qwen3-30b-a3b", hidden_size=2048, moe_ffn_hidden_size=768, num_moe_experts=128,
            moe_router_topk=8, num_layers=48, num_attention_heads=32, vocab_size=151936,
            source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
            notes="every layer is MoE (decoder_sparse_step 1, mlp_only_layers []); no shared expert",
        ),
        ModelPreset(
            name="deepseek-v3", hidden_size=7168, moe_ffn_hidden_size=2048, num_moe_experts=256,
            moe_router_topk=8, num_layers=61, num_attention_heads=128, vocab_size=129280,
            moe_shared_expert_intermediate_size=2048, mtp_num_layers=1,
            source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
            notes="n_shared_experts 1 (x moe_intermediate_size 2048); first_k_dense_replace 3 (the first 3 "
                  "layers are dense); num_nextn_predict_layers 1 (MTP); 61 layers is prime, so pipeline "
                  "parallelism needs an uneven layout that `generate` does not produce (use PP 1)",
        ),
        ModelPreset(
            name="mixtral-8x7b", hidden_size=4096, moe_ffn_hidden_size=14336, num_moe_experts=8,
            moe_router_topk=2, num_layers=32, num_attention_heads=32, vocab_size=32000,
            source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
            notes="num_local_experts 8, num_experts_per_tok 2; the expert FFN is intermediate_size 14336",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    key = name.strip().lower()
    if key not in PRESETS:
        raise PresetError(name, sorted(PRESETS))
    return PRESETS[key]
