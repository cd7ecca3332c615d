"""One mode of a verification on one rank: build the small MoE LM, train it, record every step (torch).

Every mode starts from the same seed and sees the same batches (corpus.py), so the modes differ only in
the schedule and the delayed wgrad, which is what the loss comparison needs.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch
import torch.distributed as dist

from moe_overlap.verify.config import VerifyConfig
from moe_overlap.verify.corpus import sample_windows
from moe_overlap.verify.modes import ModeSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class InjectedFault(RuntimeError):
    """Raised by the test-only fault injection (crash:RANK:MODE:STEP)."""


def effective_config_lines(cfg: VerifyConfig, spec: ModeSpec, world: int, device: str) -> list[str]:
    """The effective config in Megatron-LM's argument-dump layout (check-logs reads it, as it reads Megatron's)."""
    args = {
        "delay_wgrad_compute": spec.delay_wgrad,
        "expert_model_parallel_size": world,
        "hidden_size": cfg.hidden_size,
        "micro_batch_size": cfg.micro_batch_size,
        "moe_ffn_hidden_size": cfg.moe_ffn_hidden_size,
        "moe_flex_dispatcher_backend": None,
        "moe_router_topk": cfg.moe_router_topk,
        "moe_token_dispatcher_type": cfg.moe_token_dispatcher_type,
        "num_attention_heads": cfg.num_attention_heads,
        "num_layers": cfg.num_layers,
        "num_micro_batches": cfg.micro_batches,
        "num_moe_experts": cfg.num_moe_experts,
        "overlap_moe_expert_parallel_comm": spec.overlap,
        "precision": cfg.precision,
        "seed": cfg.seed,
        "seq_length": cfg.seq_length,
        "verify_device": device,
        "verify_mode": spec.name,
        "verify_schedule": spec.schedule,
    }
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()]
    lines.append("-------------------- end of arguments ---------------------")
    return lines


def make_batches(cfg: VerifyConfig, step: int, rank: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for micro in range(cfg.micro_batches):
        windows = sample_windows(seed=cfg.seed, step=step, micro=micro, rank=rank,
                                 batch=cfg.micro_batch_size, seq=cfg.seq_length)
        data_BS1 = torch.tensor([list(w) for w in windows], dtype=torch.long)
        out.append((data_BS1[:, :-1].contiguous().to(device), data_BS1[:, 1:].contiguous().to(device)))
    return out


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _fault_for(fault: str | None, kind: str, rank: int, mode: str) -> int | None:
    """The step at which this rank must crash/hang in this mode, if any."""
    if not fault or not fault.startswith(kind + ":"):
        return None
    _, f_rank, f_mode, f_step = fault.split(":")
    return int(f_step) if int(f_rank) == rank and f_mode == mode else None


def run_mode(cfg: VerifyConfig, spec: ModeSpec, group: Any, device: torch.device, emit, log,
             fault: str | None = None) -> None:
    """Train `cfg.steps` steps in mode `spec`; `emit(kind, **data)` heartbeats, `log(line)` the training log."""
    from moe_overlap.ep.model import ModelConfig, MoETransformer
    from moe_overlap.ep.step import forward_backward

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    for line in effective_config_lines(cfg, spec, world, device.type):
        log(line)
    mcfg = ModelConfig(vocab_size=cfg.vocab_size, hidden=cfg.hidden_size, ffn=cfg.moe_ffn_hidden_size,
                       num_heads=cfg.num_attention_heads, num_layers=cfg.num_layers,
                       num_experts=cfg.num_moe_experts, topk=cfg.moe_router_topk, seed=cfg.seed)
    model = MoETransformer(mcfg, group).to(device=device, dtype=DTYPES[cfg.precision])
    lr = cfg.lr * (1.5 if fault == f"perturb:{spec.name}" else 1.0)  # test-only: a deliberately wrong mode
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    crash_at, hang_at = _fault_for(fault, "crash", rank, spec.name), _fault_for(fault, "hang", rank, spec.name)
    tokens_per_step = world * cfg.micro_batches * cfg.micro_batch_size * cfg.seq_length
    notes: list[str] = []
    emit("mode_start", mode=spec.name, schedule=spec.schedule, delay_wgrad=spec.delay_wgrad)
    for step in range(cfg.steps):
        if crash_at == step:
            raise InjectedFault(f"injected crash on rank {rank} in mode {spec.name} at step {step}")
        if hang_at == step:
            log(f"injected hang on rank {rank} in mode {spec.name} at step {step}")
            while True:  # the other ranks block in their next collective: a real distributed hang
                time.sleep(3600)
        batches = make_batches(cfg, step, rank, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        result = forward_backward(model, batches, schedule=spec.schedule, delay_wgrad=spec.delay_wgrad,
                                  chunks=cfg.chunks, group=group)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        local = [float(x) for x in result.losses]
        local_mean = sum(local) / len(local)
        # all_gather, not all_reduce: every rank sums the same values in the same order (bitwise stable).
        mine = torch.tensor([local_mean, dt], dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine, group=group)
        rows = [g.tolist() for g in gathered]
        loss = sum(r[0] for r in rows) / world
        step_time = max(r[1] for r in rows)
        mem = peak_memory_bytes(device)
        for n in getattr(result, "notes", None) or []:
            if n not in notes:
                notes.append(str(n))
        emit("step", mode=spec.name, step=step, loss=loss, loss_hex=float(loss).hex(), step_time_s=step_time,
             tokens_per_s=tokens_per_step / step_time if step_time > 0 else 0.0, peak_memory_bytes=mem,
             local_losses=[x.hex() for x in local])
        log(f" [moe-overlap] mode {spec.name} | step {step + 1}/{cfg.steps} | lm+aux loss {loss:.6f} | "
            f"step time {step_time * 1000:.1f} ms | tokens/s {tokens_per_step / max(step_time, 1e-9):.0f} | "
            f"peak memory {mem / 2**20:.1f} MiB")
    emit("mode_end", mode=spec.name, notes=notes)
    log(f" [moe-overlap] training finished: mode {spec.name}, {cfg.steps} steps")
