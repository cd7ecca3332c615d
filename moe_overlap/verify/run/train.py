"""The modes of a verification on one rank: build the small MoE LM per mode, train, record every step (torch).

Every mode starts from the same seed and sees the same batches (corpus.py), so the modes differ only in
the schedule and the delayed wgrad, which is what the loss comparison needs.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch
import torch.distributed as dist

from moe_overlap.verify.plan.config import VerifyConfig
from moe_overlap.verify.plan.modes import ModeSpec
from moe_overlap.verify.run.corpus import sample_windows

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Adam:
    """Plain Adam (Kingma & Ba; no weight decay, no amsgrad), one parameter at a time.

    Why not torch.optim.Adam: constructing any torch.optim optimizer imports torch._dynamo, which costs
    2-5 s per rank on this kind of machine, as much as importing torch itself; a verification launches
    every rank anew. The update is the textbook one in the parameter's dtype, identical for every mode.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, (self.b1, self.b2), self.eps, self.t = lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


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
    # Process-wide (all modes share the process): a ceiling, not a per-mode figure. Linux reports KiB.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _fault_for(fault: str | None, kind: str, rank: int, mode: str) -> int | None:
    """The step at which this rank must crash/hang in this mode, if any."""
    if not fault or not fault.startswith(kind + ":"):
        return None
    _, f_rank, f_mode, f_step = fault.split(":")
    return int(f_step) if int(f_rank) == rank and f_mode == mode else None


class ModeRunner:
    """One mode's model, optimizer and training log on this rank; `step(i)` runs optimizer step i.

    The worker interleaves the modes step by step (baseline step i, overlap step i, ...), so a slow
    drift of the machine (other jobs, caches, clocks) hits every mode alike instead of biasing the
    throughput ratio towards whichever mode ran last.
    """

    def __init__(self, cfg: VerifyConfig, spec: ModeSpec, group: Any, device: torch.device, emit, log,
                 fault: str | None = None, *, counts_group: Any = None, transport: Any = None,
                 sm_margin: int = 0, graphs: bool = False, sync_free: bool = False) -> None:
        from moe_overlap.ep.model import ModelConfig, MoETransformer
        from moe_overlap.ep.streams import make_comm_stream

        self.cfg, self.spec, self.group, self.device, self.emit, self.log = cfg, spec, group, device, emit, log
        # Every mode uses the same host count group and all-to-all transport: only the schedule differs.
        self.counts_group, self.transport = counts_group, transport
        self.sm_margin = sm_margin  # ep/sm_margin.py: used by the 1f1b modes' expert GEMMs only
        self.sync_free = sync_free  # ep/sync_free.py: the host-sync-free EP path
        # ep/node_graphs.py: this mode's captured experts nodes, reused across its steps (None: eager)
        from moe_overlap.ep.node_graphs import ExpertGraphs

        self.graphs = ExpertGraphs() if graphs and spec.schedule != "chunked" else None
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        for line in effective_config_lines(cfg, spec, self.world, device.type):
            log(line)
        mcfg = ModelConfig(vocab_size=cfg.vocab_size, hidden=cfg.hidden_size, ffn=cfg.moe_ffn_hidden_size,
                           num_heads=cfg.num_attention_heads, num_layers=cfg.num_layers,
                           num_experts=cfg.num_moe_experts, topk=cfg.moe_router_topk, seed=cfg.seed)
        self.model = MoETransformer(mcfg, group).to(device=device, dtype=DTYPES[cfg.precision])
        lr = cfg.lr * (1.5 if fault == f"perturb:{spec.name}" else 1.0)  # test-only: a deliberately wrong mode
        self.opt = Adam(self.model.parameters(), lr=lr)
        self.crash_at = _fault_for(fault, "crash", self.rank, spec.name)
        self.hang_at = _fault_for(fault, "hang", self.rank, spec.name)
        self.tokens_per_step = self.world * cfg.micro_batches * cfg.micro_batch_size * cfg.seq_length
        # On GPU the overlap modes issue their all-to-alls on a communication stream; the baseline keeps
        # everything on the compute stream (the no-overlap reference). gloo needs none.
        self.comm_stream = make_comm_stream(device) if spec.overlap else None
        self.notes: list[str] = []
        self.step_times: list[float] = []  # the slowest rank's, identical on every rank (all_gather)
        emit("mode_start", mode=spec.name, schedule=spec.schedule, delay_wgrad=spec.delay_wgrad)

    def step(self, step: int) -> None:
        from moe_overlap.ep.step import forward_backward

        cfg, spec, device = self.cfg, self.spec, self.device
        if self.crash_at == step:
            raise InjectedFault(f"injected crash on rank {self.rank} in mode {spec.name} at step {step}")
        if self.hang_at == step:
            self.log(f"injected hang on rank {self.rank} in mode {spec.name} at step {step}")
            while True:  # the other ranks block in their next collective: a real distributed hang
                time.sleep(3600)
        batches = make_batches(cfg, step, self.rank, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)  # the modes interleave: a per-step peak is per mode
        t0 = time.perf_counter()
        # Host issue time: t0 to result.issued_at, when the host had queued the step's last work (after the
        # gradient reduction, before the loss read-back that waits for the GPU); not the optimizer (timed on its
        # own). It also holds the host's waits where the code syncs: the batch check and, at EP > 1, each count
        # exchange (its device-to-host copy waits for the work queued before it). The benchmarks' host issue time
        # (benchmarks/common/timing.py, Clock) is the same reading around one layer after a device sync.
        result = forward_backward(self.model, batches, schedule=spec.schedule, delay_wgrad=spec.delay_wgrad,
                                  chunks=cfg.chunks, group=self.group, streams=self.comm_stream,
                                  counts_group=self.counts_group, transport=self.transport,
                                  sm_margin=self.sm_margin, sync_free=self.sync_free, graphs=self.graphs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t_opt = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        dt, opt_dt = t1 - t0, t1 - t_opt
        host_dt = result.issued_at - t0 if result.issued_at is not None else -1.0  # -1: not stamped on this rank
        local = [float(x) for x in result.losses]
        # all_gather, not all_reduce: every rank sums the same values in the same order (bitwise stable).
        mine = torch.tensor([sum(local) / len(local), dt, opt_dt, host_dt], dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine, group=self.group)
        rows = [g.tolist() for g in gathered]
        loss = sum(r[0] for r in rows) / self.world
        step_time = max(r[1] for r in rows)
        optimizer_time = max(r[2] for r in rows)
        # The slowest rank's, like the step time; None when a rank could not stamp it.
        host_issue = max(r[3] for r in rows) if min(r[3] for r in rows) >= 0 else None
        mem = peak_memory_bytes(device)
        for n in getattr(result, "notes", None) or []:
            if str(n) not in self.notes:
                self.notes.append(str(n))
        tps = self.tokens_per_step / step_time if step_time > 0 else 0.0
        self.emit("step", mode=spec.name, step=step, loss=loss, loss_hex=float(loss).hex(), step_time_s=step_time,
                  tokens_per_s=tps, peak_memory_bytes=mem, optimizer_s=optimizer_time,
                  host_issue_s=host_issue,
                  local_losses=[x.hex() for x in local])
        self.log(f" [moe-overlap] mode {spec.name} | step {step + 1}/{cfg.steps} | lm loss {loss:.6f} | "
                 f"step time {step_time * 1000:.1f} ms | tokens/s {tps:.0f} | peak memory {mem / 2**20:.1f} MiB")
        self.step_times.append(step_time)

    def finish(self) -> None:
        """The mode's last record and log line, once the worker stops stepping (worker.py: steps may be extended)."""
        self.emit("mode_end", mode=self.spec.name, notes=self.notes)
        self.log(f" [moe-overlap] training finished: mode {self.spec.name}, {len(self.step_times)} steps")
