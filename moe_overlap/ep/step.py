"""One training step's forward + backward over M micro-batches: the entry point of verification runs.

    forward_backward(model, batches, schedule=..., delay_wgrad=..., chunks=..., group=...) -> StepResult

schedule:
    "none"    sequential: each micro-batch forward then backward, through the node functions of
              ep/nodes.py (the bitwise reference of "1f1b")
    "chunked" plain autograd through MoELayer's chunked layer schedule (overlap inside one layer)
    "1f1b"    cross-micro-batch overlap (ep/schedule_1f1b.py), Megatron-Core's
              overlap_moe_expert_parallel_comm; delay_wgrad=True adds delay_wgrad_compute

Shape legend: B micro-batch size, S sequence length; a micro-batch is (tokens_BS, labels_BS), int64.

On return every gradient is complete (delayed wgrad flushed) and data-parallel reduced over `group`:
each rank's objective is the mean over its micro-batches; the step's objective is the mean over
ranks, so dense (replicated) gradients are all-reduced and divided by the group size, and expert
gradients (which already hold every rank's contribution through the all-to-alls) are divided by it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from moe_overlap.ep.all_to_all import group_size
from moe_overlap.ep.nodes import MicroBatchRun, NodeContext
from moe_overlap.ep.schedule_1f1b import run_1f1b, run_sequential
from moe_overlap.ep.sync_free import check_usable as sync_free_check_usable
from moe_overlap.ep.wgrad import WgradStore

SCHEDULES = ("none", "chunked", "1f1b")
WGRAD_RULE_ID = "wgrad-requires-overlap"


class StepConfigError(ValueError):
    """Invalid step options; `rule_id` is the validator's rule id when one applies."""

    def __init__(self, message: str, rule_id: str | None = None) -> None:
        super().__init__(f"[{rule_id}] {message}" if rule_id else message)
        self.rule_id = rule_id


@dataclass
class StepResult:
    losses: list[float]  # LM loss of each micro-batch on this rank (aux losses excluded)
    notes: list[str] = field(default_factory=list)
    # time.perf_counter() when the host had queued the step's last work (after the gradient reduction, before
    # the losses are read back, which waits for the GPU): the host issue time's end, for the verification.
    issued_at: float | None = None


def check_step_options(schedule: str, delay_wgrad: bool, chunks: int, num_micro_batches: int) -> None:
    if schedule not in SCHEDULES:
        raise StepConfigError(f"schedule={schedule!r}: must be one of {SCHEDULES}")
    if delay_wgrad and schedule != "1f1b":
        raise StepConfigError(
            f"delay_wgrad (delay_wgrad_compute) requires the 1f1b overlap "
            f"(overlap_moe_expert_parallel_comm); got schedule={schedule!r}. "
            "Fix: set schedule='1f1b' or delay_wgrad=False.", WGRAD_RULE_ID)
    if not isinstance(chunks, int) or chunks < 1:
        raise StepConfigError(f"chunks={chunks!r}: must be an int >= 1")
    if num_micro_batches < 1:
        raise StepConfigError("batches is empty: pass at least one (tokens_BS, labels_BS) micro-batch")


def check_batches(batches, vocab_size: int, device: torch.device) -> None:
    """Each micro-batch must be (tokens_BS, labels_BS): int64, same [B, S] shape, on `device`, ids < vocab."""
    for i, mb in enumerate(batches):
        if not (isinstance(mb, (tuple, list)) and len(mb) == 2 and all(isinstance(t, torch.Tensor) for t in mb)):
            raise StepConfigError(f"batches[{i}]: expected a pair (tokens_BS, labels_BS) of tensors, got {type(mb)}")
        tokens, labels = mb
        problems = []
        if tokens.dim() != 2 or tokens.shape != labels.shape:
            problems.append(f"shapes {tuple(tokens.shape)} / {tuple(labels.shape)} (need equal [B, S])")
        if tokens.dtype != torch.int64 or labels.dtype != torch.int64:
            problems.append(f"dtypes {tokens.dtype} / {labels.dtype} (need torch.int64)")
        if tokens.device != device or labels.device != device:
            problems.append(f"devices {tokens.device} / {labels.device} (the model is on {device})")
        if not problems and tokens.numel() and int(torch.maximum(tokens.max(), labels.max())) >= vocab_size:
            problems.append(f"token id >= vocab_size={vocab_size}")
        if problems:
            raise StepConfigError(f"batches[{i}]: " + "; ".join(problems))


def reduce_gradients(model, group) -> None:
    """Average gradients over the EP group (which is also the data-parallel group here).

    One flat all-reduce for all dense gradients: fewer collectives, and a fixed reduction order so
    the result is identical whichever schedule produced the local gradients.
    """
    world = dist.get_world_size(group)
    if world == 1:
        return
    dense = model.dense_parameters()
    for p in dense:  # a parameter with no gradient on one rank must still join the collective
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in dense])
    dist.all_reduce(flat, group=group)
    flat.div_(world)
    offset = 0
    for p in dense:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n
    for p in model.expert_parameters():
        if p.grad is not None:
            p.grad.div_(world)


def autograd_forward_backward(model, batches, *, layer_schedule: str, chunks: int, group,
                              streams=None, counts_group=None, transport=None) -> StepResult:
    """The same step through plain autograd (`MoETransformer.forward`, MoELayer's own layer schedule
    "none" | "chunked"), no nodes. schedule="chunked" uses it; tests and benchmarks use it with
    "none" as the independent reference of the node path (equal to rounding, not bitwise: the aux
    loss enters the objective as a product instead of a constant gradient)."""
    model.zero_grad(set_to_none=True)
    loss_ts = []
    scale = 1.0 / len(batches)
    for tokens_BS, labels_BS in batches:
        lm_loss, objective = model(tokens_BS, labels_BS, schedule=layer_schedule, chunks=chunks,
                                   comm_stream=streams, counts_group=counts_group, transport=transport)
        objective.backward(torch.full_like(objective, scale))
        loss_ts.append(lm_loss.detach())
    reduce_gradients(model, group)
    issued_at = time.perf_counter()
    return StepResult(losses=torch.stack(loss_ts).float().tolist(), issued_at=issued_at)


def forward_backward(
    model,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    schedule: str,
    delay_wgrad: bool,
    chunks: int = 1,
    group,
    streams: torch.cuda.Stream | None = None,
    counts_group=None,
    transport=None,
    sm_margin: int = 0,
    sync_free: bool = False,
    capacity: int | None = None,
    graphs=None,
) -> StepResult:
    """Forward + backward of all micro-batches; gradients complete and reduced on return.

    model: MoETransformer whose MoE layers use `group`; batches: M pairs (tokens_BS, labels_BS) of
    int64 on the model's device; streams: the CUDA communication stream (None on CPU / to issue
    all-to-alls on gloo's thread); counts_group: a host (gloo) group over the same ranks for the
    token-count exchange (ep/counts.py; None: over `group`); transport: copy-engine all-to-alls
    (ep/transport.py; None: the group's own); sm_margin: SMs the expert GEMMs of a 1f1b layer pair leave
    to the all-to-all kernels in flight beside them (ep/sm_margin.py; the other schedules ignore it);
    sync_free: the host-sync-free EP path (ep/sync_free.py; schedules none and 1f1b; ``capacity`` rows per peer,
    None: the worst case, bitwise the default path); graphs: a node_graphs.ExpertGraphs kept across steps (its
    captures are reused) to replay the experts nodes from CUDA graphs where ``graphs.applies`` says they apply
    (a note says why where not), None: eager.
    Gradients are reset first (`set_to_none`): one call = one step.
    Raises StepConfigError (a ValueError; `.rule_id` == "wgrad-requires-overlap" for delayed wgrad
    without 1f1b) on bad options.
    """
    batches = list(batches)
    check_step_options(schedule, delay_wgrad, chunks, len(batches))
    # One host sync per step for the id range check; cheap next to the per-layer count exchanges.
    check_batches(batches, model.cfg.vocab_size, model.embed.weight.device)
    if sync_free:
        if schedule == "chunked":
            raise StepConfigError("sync_free: the chunked schedule keeps the host splits; use none or 1f1b")
        sync_free_check_usable(transport)
    if schedule == "chunked":
        return autograd_forward_backward(model, batches, layer_schedule="chunked", chunks=chunks, group=group,
                                         streams=streams, counts_group=counts_group, transport=transport)
    model.zero_grad(set_to_none=True)
    notes: list[str] = []
    store = WgradStore() if delay_wgrad else None
    if graphs is not None:
        local = group_size(group) == 1 and not sync_free
        ok, why = graphs.applies(model.embed.weight.device, local, sync_free, delay_wgrad)
        graphs = graphs if ok else None
        notes.append(f"graphs: {why}")
    ctx = NodeContext(group=group, comm_stream=streams, store=store, grad_scale=1.0 / len(batches),
                      counts_group=counts_group, transport=transport, sm_margin=sm_margin,
                      sync_free=sync_free, capacity=capacity, graphs=graphs)
    # slot: micro-batch parity, the experts-node graph each uses (node_graphs.py: at most two in flight)
    runs = [MicroBatchRun(model, t, y, ctx, slot=k % 2) for k, (t, y) in enumerate(batches)]
    if schedule == "1f1b":
        notes += run_1f1b(runs, store)
    else:
        run_sequential(runs)
    if graphs is not None and graphs.error:
        notes.append(f"graphs: a capture failed, that experts node ran eagerly ({graphs.error})")
    loss_ts = [r.loss for r in runs]
    reduce_gradients(model, group)
    issued_at = time.perf_counter()
    # One host sync for all losses, at the very end (a .item() per micro-batch would stall the GPU).
    losses = torch.stack(loss_ts).float().tolist()
    return StepResult(losses=losses, notes=notes, issued_at=issued_at)
