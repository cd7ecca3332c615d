"""A small MoE transformer language model for verification runs and the 1F1B schedule.

Shape legend: B micro-batch size, S sequence length, T = B*S tokens, D hidden, H heads, Dh = D/H head
dim, V vocabulary, E global experts, E_local experts on this rank, F expert ffn hidden.

Layout: embedding -> L x [x + attn(norm1(x)); h + moe(norm2(h))] -> final norm -> LM head.
Weights are not tied (one parameter = one gradient accumulation per node, which keeps the gradient
accumulation order identical between schedules).

Initialisation is deterministic from `seed` and independent of the EP size: every rank draws the
same stream for the replicated parameters; expert e of each expert tensor is drawn from its own
generator (seeded from `seed`, the parameter's name and e), so a rank draws only its local experts and
EP 1 and EP 4 start from the same function. Drawing the global [E, D, 2F] tensor on every rank instead
cost minutes per run at GPU-sized shapes (fp32 on the host: 13 GB per rank for 2 layers of 64 x 2048 x
4096 experts, once per verification mode).
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from moe_overlap.ep.layer import MoELayer
from moe_overlap.ep.linear import split_linear
from moe_overlap.ep.wgrad import WgradStore


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of the toy MoE LM (Megatron field names in comments)."""

    vocab_size: int = 64  # vocab_size
    hidden: int = 32  # hidden_size
    ffn: int = 32  # moe_ffn_hidden_size
    num_heads: int = 4  # num_attention_heads
    num_layers: int = 2  # num_layers
    num_experts: int = 4  # num_moe_experts
    topk: int = 2  # moe_router_topk
    router_score: str = "softmax"
    force_balance: bool = False  # benchmarks: balanced expert choice so timings ignore routing skew
    aux_loss_coeff: float = 1e-2  # moe_aux_loss_coeff
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.hidden % self.num_heads == 0, "hidden must be divisible by num_heads"),
            (1 <= self.topk <= self.num_experts, "topk must be in [1, num_experts]"),
            (self.num_layers >= 1, "num_layers must be >= 1"),
            (self.router_score in ("softmax", "sigmoid"), "router_score must be softmax or sigmoid"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"ModelConfig: {msg} (got {asdict(self)})")


class CausalSelfAttention(nn.Module):
    """Causal multi-head attention written as plain matmuls + softmax.

    Why not SDPA: the fused flash/efficient kernels accumulate dq with atomics on GPU, which breaks the
    bit-for-bit comparison between schedules; at these sizes the math path costs nothing.
    The projections go through `split_linear` so their wgrad can be delayed with the experts'.
    """

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x_BSD: torch.Tensor, wgrad_store: WgradStore | None = None) -> torch.Tensor:
        B, S, D = x_BSD.shape
        H = self.num_heads
        q, k, v = split_linear(x_BSD, self.qkv.weight, wgrad_store).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)  # each [B, H, S, Dh]
        scores_BHSS = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
        mask_SS = torch.ones(S, S, dtype=torch.bool, device=x_BSD.device).triu(1)
        probs_BHSS = scores_BHSS.masked_fill(mask_SS, float("-inf")).softmax(-1)
        out_BSD = (probs_BHSS @ v).transpose(1, 2).reshape(B, S, D)
        return split_linear(out_BSD, self.proj.weight, wgrad_store)


class Block(nn.Module):
    """One transformer layer: pre-norm attention, pre-norm MoE, two residuals."""

    def __init__(self, cfg: ModelConfig, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden, eps=1e-6)
        self.attn = CausalSelfAttention(cfg.hidden, cfg.num_heads)
        self.norm2 = nn.RMSNorm(cfg.hidden, eps=1e-6)
        # No init of its own: init_parameters writes every parameter of the model.
        self.moe = MoELayer(cfg.hidden, cfg.ffn, cfg.num_experts, cfg.topk, group, score=cfg.router_score,
                            force_balance=cfg.force_balance, skip_init=True)

    def attention(self, x_BSD: torch.Tensor, wgrad_store: WgradStore | None = None) -> torch.Tensor:
        """First half of the layer: x + attn(norm1(x)) -> residual stream h [B, S, D]."""
        return x_BSD + self.attn(self.norm1(x_BSD), wgrad_store)


class MoETransformer(nn.Module):
    """Small MoE LM. `forward` is the plain autograd path (schedule none/chunked of the MoE layer);
    the node-by-node path used by the 1F1B schedule lives in ep/nodes.py and reuses these modules."""

    def __init__(self, cfg: ModelConfig, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg, group) for _ in range(cfg.num_layers))
        self.final_norm = nn.RMSNorm(cfg.hidden, eps=1e-6)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        init_parameters(self, cfg.seed, dist.get_rank(group) if group is not None else 0)

    def expert_parameters(self) -> list[nn.Parameter]:
        """Parameters sharded over the EP group (their gradient is local, never all-reduced)."""
        return [p for blk in self.layers for p in blk.moe.experts.parameters()]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters replicated on every EP rank (data parallel: gradients are averaged)."""
        expert_ids = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in expert_ids]

    def logits_loss(self, x_BSD: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head + mean cross entropy (fp32 logits for a stable softmax)."""
        logits_BSV = self.head(self.final_norm(x_BSD)).float()
        return F.cross_entropy(logits_BSV.flatten(0, 1), labels_BS.flatten())

    def forward(self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, *, schedule: str = "none",
                chunks: int = 1, comm_stream=None, counts_group=None,
                transport=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain autograd forward through MoELayer's own schedules ("none" | "chunked").

        Returns (lm_loss, objective) with objective = lm_loss + aux_loss_coeff * sum of the layers'
        aux losses: the function the node path (ep/nodes.py) differentiates too.
        """
        x_BSD = self.embed(tokens_BS)
        aux = x_BSD.new_zeros((), dtype=torch.float32)
        for blk in self.layers:
            h_BSD = blk.attention(x_BSD)
            y_TD, aux_l = blk.moe(blk.norm2(h_BSD).flatten(0, 1), schedule=schedule, chunks=chunks,
                                  comm_stream=comm_stream, counts_group=counts_group, transport=transport)
            x_BSD = h_BSD + y_TD.view_as(h_BSD)
            aux = aux + aux_l.float()
        lm_loss = self.logits_loss(x_BSD, labels_BS)
        return lm_loss, lm_loss + self.cfg.aux_loss_coeff * aux


@torch.no_grad()
def init_parameters(model: MoETransformer, seed: int, ep_rank: int) -> None:
    """Deterministic init independent of EP size (see module docstring).

    Norm weights = 1; embeddings N(0, 1); every matrix N(0, 1/fan_in). Replicated parameters are drawn
    in `named_parameters` order from one stream, identical on every rank; global expert e of an expert
    tensor from :func:`expert_generator` (only this rank's E_local experts are drawn).
    """
    gen = torch.Generator().manual_seed(seed)
    expert_ids = {id(p) for p in model.expert_parameters()}
    for name, p in model.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
            continue
        if id(p) in expert_ids:
            _draw_experts(p, seed, name, ep_rank)
            continue
        fan_in = 1 if "embed" in name else p.shape[-1]  # nn.Linear / router weight [out, in]
        p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float32) / math.sqrt(fan_in)).to(p.dtype))


def _draw_experts(p: torch.Tensor, seed: int, name: str, ep_rank: int) -> None:
    """Local experts of w1 [E_local, D, 2F] / w2 [E_local, F, D] (contraction dim 1: fan_in = shape[1]).

    One generator per expert makes them independent draws, so they run on a few threads (torch's CPU
    randn is single-threaded and releases the GIL): the values do not depend on the thread count.
    """
    n, scale = p.shape[0], 1.0 / math.sqrt(p.shape[1])

    @torch.no_grad()  # grad mode is per thread: the caller's no_grad does not reach the pool's threads
    def draw(j: int) -> None:
        gen = expert_generator(seed, name, ep_rank * n + j)
        p[j].copy_((torch.randn(p.shape[1:], generator=gen, dtype=torch.float32) * scale).to(p.dtype))

    with ThreadPoolExecutor(max_workers=max(1, min(8, n, os.cpu_count() or 1))) as pool:
        list(pool.map(draw, range(n)))


def expert_generator(seed: int, name: str, expert: int) -> torch.Generator:
    """The generator of global expert ``expert`` of parameter ``name``: depends on nothing else (not on the
    EP size, the rank, or the other parameters), so any rank can draw any expert alone."""
    digest = hashlib.blake2b(f"{seed}/{name}/{expert}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
