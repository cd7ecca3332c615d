"""The estimator's schedules of one MoE layer stack: the per-layer costs split over Megatron-Core's nodes, and the
step of `none`, `1f1b` and `1f1b+wgrad` on the two-stream timelines (skill/estimate/timeline.py), each floored by
the host's issue time (skill/estimate/host.py), with the recompute, the pipeline bubble and what the model leaves
out of a measured step added (torch-free)."""

from __future__ import annotations

from moe_overlap.skill.estimate import costs
from moe_overlap.skill.estimate.host import floor_ms
from moe_overlap.skill.estimate.model import EstimateRequest, PerLayer, ResolvedHardware, ScheduleEstimate
from moe_overlap.skill.estimate.timeline import NodeTimes, blend, layer_timeline, one_f_one_b_timeline


def layer_nodes(p: PerLayer) -> NodeTimes:
    """Split the per-layer costs over the nodes: permute and unpermute are 1/4 each of permute_ms (forward: pre and
    post; backward: post and pre), sort and unsort 1/4 each of sort_ms (beside the experts); the activation is 3/8
    forward, 5/8 backward; the host overhead half before each pass."""
    g, s, a, o = p.permute_ms / 4, p.sort_ms / 4, p.activation_ms, p.overhead_ms / 2
    return NodeTimes(
        pre_f=p.attn_fwd_ms + p.router_fwd_ms + g + o,
        mlp_f=p.expert_fwd_ms + 2 * s + 3 / 8 * a,
        post_f=g,
        post_b=g + o,
        dgrad_b=p.expert_fwd_ms + 2 * s + 5 / 8 * a,
        wgrad_b=p.expert_fwd_ms, wgrad_fixed=p.wgrad_write_ms,
        pre_b=2 * p.attn_fwd_ms + 2 * p.router_fwd_ms + g,
        a2a=p.a2a_ms, a2a_latency=p.a2a_latency_ms, count_exchange=p.a2a_latency_ms,
    )


def _recompute_ms(n: NodeTimes) -> float:
    """Full per-layer recompute: the backward replays the layer's forward, its two all-to-alls exposed
    (Megatron-LM PR 6311: the segment replay's all-to-all is not overlapped)."""
    return n.pre_f + n.mlp_f + n.post_f + 2 * (n.a2a + n.a2a_latency)


def pair_nodes(p: PerLayer, sm_margin: int) -> NodeTimes | None:
    """The nodes of a 1f1b layer pair when its expert GEMMs leave `sm_margin` SMs free (their measured slowdown on
    the forward, dgrad and wgrad GEMMs); None without a margin (the pair runs the plain nodes)."""
    if not sm_margin:
        return None
    return layer_nodes(p.model_copy(update={"expert_fwd_ms": p.expert_fwd_ms * costs.gemm_margin_slowdown(sm_margin)}))


def schedules(req: EstimateRequest, h: ResolvedHardware, nodes: NodeTimes, eff: float,
              host_excess: float = 1.0, pair: NodeTimes | None = None) -> list[ScheduleEstimate]:
    """none, 1f1b and 1f1b+wgrad at overlap efficiency `eff` and host factors' excess scaled by `host_excess`;
    with baseline_step_ms, what the model leaves out of the measured no-overlap step is added to each."""
    out = _schedules(req, h, nodes, eff, host_excess, req.other_ms, pair)
    if req.baseline_step_ms is not None:
        rest = max(0.0, req.baseline_step_ms - out[0].step_ms)
        out = _schedules(req, h, nodes, eff, host_excess, req.other_ms + rest, pair)
    return out


def _schedules(req: EstimateRequest, h: ResolvedHardware, nodes: NodeTimes, eff: float, host_excess: float,
               other_ms: float, pair: NodeTimes | None = None) -> list[ScheduleEstimate]:
    m, L = req.micro_batches, req.layers
    extra = _recompute_ms(nodes) * m * L if req.recompute == "full" else 0.0
    none_tl = layer_timeline(nodes, 1)
    # the pipeline's fill and drain: (pp - 1) / (vpp x m) of one no-overlap pass, idle in every schedule
    bubble = (none_tl.serial * m * L + extra) * (req.pp - 1) / (req.vpp * m)

    def sched(name: str, layer_tl_ms: float, compute: float, comm: float, note: str = "",
              available: bool = True) -> ScheduleEstimate:
        # one micro-batch: the overlap pairs nothing, so it runs (and issues) what none does
        layers_ms, bound = floor_ms(layer_tl_ms, h.host_ms, name if m >= 2 else "none", m * L, excess=host_excess,
                                  engine=req.a2a_engine)
        if bound:
            note = (note + "; " if note else "") + "host-bound: the step is the host's issue time"
        return ScheduleEstimate(name=name, step_ms=layers_ms + extra + bubble + other_ms, compute_ms=compute,
                                comm_ms=comm, exposed_comm_ms=max(0.0, layer_tl_ms - compute), host_bound=bound,
                                available=available, note=note)

    out = [sched("none", none_tl.serial * m * L, none_tl.busy["compute"] * m * L, none_tl.busy["comm"] * m * L)]
    for name, delay in (("1f1b", False), ("1f1b+wgrad", True)):
        # TimelineTooLong propagates: api.py names the field
        tl = one_f_one_b_timeline(nodes, L, m, delay, wgrad_delay_cost=costs.DELAYED_WGRAD_COST, pair=pair,
                                  second_wave=h.second_wave)
        note = ("needs >= 2 micro-batches (warning single-micro-batch): same as none" if m < 2 else
                "first forward and last backward run alone; forward of micro-batch k+1 overlaps backward of k")
        out.append(sched(name, blend(tl, eff), tl.busy["compute"], tl.busy["comm"], note, available=m >= 2))
    for s in out:
        s.speedup = out[0].step_ms / s.step_ms if s.step_ms > 0 else 1.0
    return out
