"""The pieces of one training step, timed alone in the ranks that trained (torch).

After the modes have trained, every rank replays one step's worth of micro-batches through the baseline
model's MoE layers, piece by piece, as benchmarks/gpu/ep_overlap_body.py does for a layer:

  count exchange  the token counts of each dispatch (ep/counts.py)
  all-to-alls     dispatch, combine and their backward twins (same bytes, swapped splits), on the compute
                  stream, nothing beside them
  experts         forward, dgrad and wgrad GEMMs on the rows this rank received
  overlap probe   the dispatch all-to-all issued asynchronously (comm stream on CUDA, gloo's thread on CPU)
                  beside the experts' forward: the hidden share of the shorter of the two
  layer (host)    each layer's forward + backward without overlap (attention, norms, the MoE layer's schedule
                  "none", through autograd), from the layer's input in that forward: its time and its host
                  issue time (how long the host took to queue it, read before the closing device sync, as
                  benchmarks/common/timing.py's Clock does). Per layer and micro-batch it is the
                  estimator's ``host_ms`` (skill/estimate/host.py). Timed one layer at a time after a sync,
                  the host waits only on the layer's own router work at its count exchange, not on the GPU
                  work of earlier layers as it does inside a training step (train.py: StepResult.issued_at)

Routing is the model's own (not forced balanced), on the inputs each MoE layer saw in a forward of step 0's
micro-batches, so the bytes and rows are those of the run. Each timed call starts after a barrier of all ranks
and ends with a device sync; a round sums one step's calls per piece; the result is the median over rounds
of the slowest rank's sums (round 0 is a warm-up).

Shape legend: T tokens per micro-batch per rank, D hidden, N = T*K routed rows, S rows received.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

ROUNDS = 3
KEYS = ("count_exchange", "a2a", "experts_fwd", "experts_dgrad", "experts_wgrad", "probe_a2a", "probe_experts",
        "probe_both", "layer", "layer_host")


def capture_moe_inputs(model, batches) -> list[list[torch.Tensor]]:
    """[layer][micro-batch] the input x_TD each MoE layer saw in a no-grad forward (a collective: all ranks)."""
    return capture_inputs(model, batches, lambda blk: blk.moe)


def capture_inputs(model, batches, module_of) -> list[list[torch.Tensor]]:
    """[layer][micro-batch] the first input `module_of(block)` saw in a no-grad forward (a collective)."""
    inputs: list[list[torch.Tensor]] = [[] for _ in model.layers]
    handles = []
    for i, blk in enumerate(model.layers):
        def hook(_module, args, i=i):
            inputs[i].append(args[0].detach())
        handles.append(module_of(blk).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for tokens_BS, labels_BS in batches:
                model(tokens_BS, labels_BS)
    finally:
        for h in handles:
            h.remove()
    return inputs


class _Timer:
    """Host clock around one call, after a barrier of all ranks, ending with a device sync."""

    def __init__(self, group, device: torch.device) -> None:
        self.group, self.device = group, device
        self._token = torch.zeros(1, device=device)
        self.totals: dict[str, float] = dict.fromkeys(KEYS, 0.0)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, key: str, fn: Callable[[], Any], host_key: str | None = None) -> Any:
        dist.all_reduce(self._token, group=self.group)  # a barrier that needs no device id under NCCL
        self._sync()
        t0 = time.perf_counter()
        out = fn()
        if host_key is not None:  # queued, not yet run (on CPU the same: every op runs as it is issued)
            self.totals[host_key] += time.perf_counter() - t0
        self._sync()
        self.totals[key] += time.perf_counter() - t0
        return out


def _a2a_kwargs(transport) -> dict[str, Any]:
    return {"transport": transport} if transport is not None else {}


def _one_layer(timer: _Timer, layer, x_TD: torch.Tensor, group, counts_group, transport, comm_stream,
               sizes: dict[str, int]) -> None:
    from moe_overlap.ep.all_to_all import all_to_all_async, all_to_all_sync
    from moe_overlap.ep.counts import exchange_counts, local_plan, make_dispatch_plan
    from moe_overlap.ep.dispatcher import permute_rows, plan_permute, sort_rows, unsort_rows
    from moe_overlap.ep.experts import experts_dgrad, experts_forward, experts_wgrad, host_counts
    from moe_overlap.ep.router import route

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    w1, w2 = layer.experts.w1.detach(), layer.experts.w2.detach()
    kw = _a2a_kwargs(transport)
    routing = route(x_TD, layer.router.weight.detach(), topk=layer.topk, score=layer.score,
                    normalize=layer.normalize, force_balance=layer.force_balance)
    pplan = plan_permute(routing.experts_TK, layer.num_experts)
    x_ND = permute_rows(x_TD, pplan)
    if world > 1:
        send, recv = timer("count_exchange", lambda: exchange_counts(
            pplan.tokens_per_expert_E.unsqueeze(0), layer.num_experts, group, counts_group=counts_group))
        plan = make_dispatch_plan(pplan, send[0], recv[0])
    else:
        plan = local_plan(pplan)
    counts = plan.tokens_per_local_expert
    recv_x = timer("a2a", lambda: all_to_all_sync(x_ND, plan.recv_splits, plan.send_splits, group, **kw))
    xs = sort_rows(recv_x, plan)
    y, h = timer("experts_fwd", lambda: experts_forward(xs, w1, w2, counts))
    yr = unsort_rows(y, plan)
    timer("a2a", lambda: all_to_all_sync(yr, plan.send_splits, plan.recv_splits, group, **kw))
    # Backward: the gradient of the combine travels like a dispatch, that of the dispatch like a combine.
    g_ND = torch.randn_like(x_ND)
    g_recv = timer("a2a", lambda: all_to_all_sync(g_ND, plan.recv_splits, plan.send_splits, group, **kw))
    dy = sort_rows(g_recv, plan)
    dx, wgrad_inputs, _ = timer("experts_dgrad", lambda: experts_dgrad(dy, xs, h, w1, w2, counts))
    timer("experts_wgrad", lambda: experts_wgrad(wgrad_inputs, w1, w2, counts))
    dxr = unsort_rows(dx, plan)
    timer("a2a", lambda: all_to_all_sync(dxr, plan.send_splits, plan.recv_splits, group, **kw))
    # The overlap probe: one dispatch beside one expert forward, each alone, then both at once.
    timer("probe_a2a", lambda: all_to_all_sync(x_ND, plan.recv_splits, plan.send_splits, group, **kw))
    timer("probe_experts", lambda: experts_forward(xs, w1, w2, counts))

    def both() -> None:
        handle = all_to_all_async(x_ND, plan.recv_splits, plan.send_splits, group, stream=comm_stream, **kw)
        experts_forward(xs, w1, w2, counts)
        handle.wait()
    timer("probe_both", both)
    if sizes is not None:
        row_bytes = x_ND.shape[1] * x_ND.element_size()
        sent, received = sum(plan.send_splits), sum(plan.recv_splits)
        own_sent = plan.send_splits[rank] if world > 1 else sent
        own_recv = plan.recv_splits[rank] if world > 1 else received
        # dispatch + grad-combine send `send_splits`, combine + grad-dispatch send `recv_splits`
        sizes["a2a_bytes_off_rank"] += 2 * ((sent - own_sent) + (received - own_recv)) * row_bytes
        rows = sum(host_counts(counts))
        sizes["rows_received"] += rows
        sizes["expert_flops"] += 18 * rows * w1.shape[1] * w2.shape[1]  # fwd 6*D*F, dgrad and wgrad as much
        sizes["a2a_calls"] += 4
        sizes["count_exchanges"] += 1 if world > 1 else 0


def _layer_host(timer: _Timer, blk, x_BSD: torch.Tensor, g_BSD: torch.Tensor, counts_group, transport) -> None:
    """One layer's forward + backward as the baseline computes it (no overlap), timed with its host issue time."""
    x = x_BSD.clone().requires_grad_()

    def fwd_bwd() -> None:
        h_BSD = blk.attention(x)
        y_TD, _aux = blk.moe(blk.norm2(h_BSD).flatten(0, 1), counts_group=counts_group, transport=transport)
        (h_BSD + y_TD.view_as(h_BSD)).backward(g_BSD)
    timer("layer", fwd_bwd, host_key="layer_host")


def measure_pieces(model, batches, group, device: torch.device, *, counts_group=None, transport=None,
                   comm_stream=None, rounds: int = ROUNDS) -> dict[str, Any]:
    """One step's pieces, timed alone; the same dict on every rank (see the module docstring)."""
    inputs = capture_moe_inputs(model, batches)
    block_inputs = capture_inputs(model, batches, lambda blk: blk.norm1)  # each layer's residual input x_BSD
    grads = [[torch.randn_like(x) for x in xs] for xs in block_inputs]
    per_round: list[list[float]] = []
    sizes = dict.fromkeys(("a2a_bytes_off_rank", "rows_received", "expert_flops", "a2a_calls",
                           "count_exchanges"), 0)
    with torch.no_grad():
        for r in range(rounds + 1):  # round 0: warm-up (allocator, first kernels), not kept
            timer = _Timer(group, device)
            for blk, xs in zip(model.layers, inputs, strict=True):
                for x_TD in xs:
                    _one_layer(timer, blk.moe, x_TD, group, counts_group, transport, comm_stream,
                               sizes if r == 1 else None)
            with torch.enable_grad():
                for blk, xs, gs in zip(model.layers, block_inputs, grads, strict=True):
                    for x_BSD, g_BSD in zip(xs, gs, strict=True):
                        _layer_host(timer, blk, x_BSD, g_BSD, counts_group, transport)
            model.zero_grad(set_to_none=True)
            if r:
                per_round.append([timer.totals[k] for k in KEYS])
    # The slowest rank's sums per round, then the median over rounds.
    t = torch.tensor(per_round, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    worst = t.cpu().tolist()
    med = {k: statistics.median(row[i] for row in worst) for i, k in enumerate(KEYS)}
    # Sizes differ per rank under real routing: the busiest rank's, like the times.
    s = torch.tensor([float(sizes[k]) for k in sorted(sizes)], dtype=torch.float64, device=device)
    dist.all_reduce(s, op=dist.ReduceOp.MAX, group=group)
    sizes = {k: int(v) for k, v in zip(sorted(sizes), s.cpu().tolist(), strict=True)}
    comm = med["a2a"] + med["count_exchange"]
    experts = med["experts_fwd"] + med["experts_dgrad"] + med["experts_wgrad"]
    probe_shorter = min(med["probe_a2a"], med["probe_experts"])
    efficiency = ((med["probe_a2a"] + med["probe_experts"] - med["probe_both"]) / probe_shorter
                  if probe_shorter > 0 and dist.get_world_size(group) > 1 else None)
    layer_steps = max(1, len(inputs) * len(batches))
    return {
        "layer_s": med["layer"], "layer_host_s": med["layer_host"],
        "host_ms_per_layer": med["layer_host"] / layer_steps * 1e3,
        "comm_s": comm, "a2a_s": med["a2a"], "count_exchange_s": med["count_exchange"], "experts_s": experts,
        "experts_fwd_s": med["experts_fwd"], "experts_dgrad_s": med["experts_dgrad"],
        "experts_wgrad_s": med["experts_wgrad"],
        "probe": {"a2a_s": med["probe_a2a"], "experts_s": med["probe_experts"], "both_s": med["probe_both"],
                  "overlap_efficiency": efficiency},
        **sizes, "rounds": rounds, "layers": len(inputs), "micro_batches": len(batches),
    }
