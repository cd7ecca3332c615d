"""The cross-micro-batch 1F1B schedule (Megatron-Core's `overlap_moe_expert_parallel_comm`).

With M >= 2 micro-batches: F(0) alone; then for k = 0..M-2 the forward of micro-batch k+1 runs
interleaved with the backward of micro-batch k, node by node (forward layer i paired with backward
layer L-1-i); then B(M-1) alone. Per layer pair, the order of Megatron-Core's layer-level 1F1B
(Megatron-LM `megatron/core/models/common/model_chunk_schedule_plan.py`, TransformerLayerSchedulePlan):

    comm    | combine_bwd(b)   | dispatch_fwd(f)  dispatch_bwd(b)            | combine_fwd(f)
    compute | pre_dispatch(f)  | experts_dgrad(b) expert_wgrad(b) experts(f) | pre_dispatch_bwd(b) attn_wgrad(b)
    host    |                  | waits for f's token counts while experts_dgrad(b) runs

Every all-to-all is *started* before the compute it hides behind and *waited* after it. On CPU the
wait blocks the host while gloo's thread moves the data; on CUDA `all_to_all_async` issues the
collective on the comm stream (which first waits for the compute stream, so launching it *before*
the compute it should overlap is what keeps the two streams independent) and `wait()` only makes
the compute stream wait on the collective's event. That per-collective event plays the role of
Megatron's per-micro-batch event: the wgrad closures record nothing, so the backward dispatch never
waits for them.

Shape legend: B micro-batch size, S sequence, D hidden; x_BSD flows forward, g_BSD (its gradient)
backward, between layers.

Why the result is bitwise the sequential one: each node runs the same ops on the same inputs in
both schedules, and every parameter receives its gradient contributions in micro-batch order
(backwards run 0, 1, 2, ...; the WgradStore is FIFO and drained inside the same layer's backward:
expert wgrad under the backward dispatch, attention wgrad right after the pre-dispatch backward).
"""

from __future__ import annotations

from moe_overlap.ep.nodes import LayerRun, MicroBatchRun
from moe_overlap.ep.sm_margin import gemm_sm_margin
from moe_overlap.ep.wgrad import WgradStore

SINGLE_MICRO_BATCH_NOTE = (
    "single-micro-batch: 1f1b needs >= 2 micro-batches to pair a forward with a backward; "
    "with 1 it degenerates to the sequential schedule (no overlap)"
)


def _drain(store: WgradStore | None) -> None:
    if store is not None:
        store.run_all()


def layer_forward(run: LayerRun, x_BSD):
    """The four forward nodes of one layer, each all-to-all waited at once (no partner to hide behind)."""
    run.pre_forward(x_BSD)
    run.plan_wait()
    run.dispatch_forward_start()
    run.dispatch_forward_wait()
    run.experts_forward()
    run.combine_forward_start()
    return run.combine_forward_wait()


def layer_backward(run: LayerRun, g_BSD, store: WgradStore | None):
    """The four backward nodes of one layer; deferred wgrad runs under the backward dispatch."""
    run.combine_backward_start(g_BSD)
    run.combine_backward_wait()
    run.experts_backward()
    run.dispatch_backward_start()
    _drain(store)  # expert wgrad under the backward dispatch
    run.dispatch_backward_wait()
    g_BSD = run.pre_backward()
    _drain(store)  # attention wgrad (nothing left in flight to hide it behind when running alone)
    return g_BSD


def forward_micro_batch(mb: MicroBatchRun) -> None:
    x = mb.embed_forward()
    for run in mb.layers:
        x = layer_forward(run, x)
    mb.head_forward(x)


def backward_micro_batch(mb: MicroBatchRun, store: WgradStore | None) -> None:
    g = mb.head_backward()
    for run in reversed(mb.layers):
        g = layer_backward(run, g, store)
    mb.embed_backward(g)


def layer_pair(f: LayerRun, b: LayerRun, x_BSD, g_BSD, store: WgradStore | None):
    """Forward of layer i (micro-batch k+1) interleaved with backward of layer L-1-i (micro-batch k).

    The host waits for f's token counts (the layer's one host sync at EP > 1) only after b's expert
    dgrad is queued, so the GPU computes while the host waits; f's dispatch is issued after that dgrad
    but waits only for f's own pre-dispatch event, so the two still run side by side.

    The expert nodes run beside in-flight all-to-alls; with ``ctx.sm_margin`` their GEMMs leave that many
    SMs to the all-to-all kernels (sm_margin.py). Nothing else runs under the margin.
    """
    margin = b.ctx.sm_margin
    b.combine_backward_start(g_BSD)  # comm: reverse combine a2a
    f.pre_forward(x_BSD)  # compute: attention, norm, router, permute; the counts start moving
    b.combine_backward_wait()
    with gemm_sm_margin(margin, x_BSD.device):
        b.experts_backward()  # compute: experts dgrad (wgrad deferred when store is set)
    f.plan_wait()  # host: f's counts -> plan, while the GPU runs the dgrad
    f.dispatch_forward_start()  # comm: dispatch a2a (after f's pre-dispatch only)
    b.dispatch_backward_start()  # comm: reverse dispatch a2a
    with gemm_sm_margin(margin, x_BSD.device):
        _drain(store)  # compute: expert wgrad while the backward dispatch is in flight
        f.dispatch_forward_wait()
        f.experts_forward()  # compute: still under the backward dispatch
    f.combine_forward_start()  # comm: combine a2a
    b.dispatch_backward_wait()
    g_BSD = b.pre_backward()  # compute: attention/router dgrad under the forward combine
    _drain(store)  # compute: attention wgrad, still under the forward combine
    x_BSD = f.combine_forward_wait()
    return x_BSD, g_BSD


def overlapped_step(f: MicroBatchRun, b: MicroBatchRun, store: WgradStore | None) -> None:
    """F(k+1) | B(k): embedding fwd and head bwd first, then layer pairs, then head fwd and embedding bwd."""
    x = f.embed_forward()
    g = b.head_backward()
    num_layers = len(f.layers)
    for i in range(num_layers):
        x, g = layer_pair(f.layers[i], b.layers[num_layers - 1 - i], x, g, store)
    f.head_forward(x)
    b.embed_backward(g)


def run_sequential(micro_batches: list[MicroBatchRun]) -> None:
    """Reference order: forward then backward of each micro-batch, through the same nodes."""
    for mb in micro_batches:
        forward_micro_batch(mb)
        backward_micro_batch(mb, None)


def run_1f1b(micro_batches: list[MicroBatchRun], store: WgradStore | None) -> list[str]:
    """Run the 1F1B schedule; returns notes (the single-micro-batch degeneration says so)."""
    notes: list[str] = []
    if len(micro_batches) == 1:
        notes.append(SINGLE_MICRO_BATCH_NOTE)
    forward_micro_batch(micro_batches[0])
    for k in range(len(micro_batches) - 1):
        overlapped_step(micro_batches[k + 1], micro_batches[k], store)
    backward_micro_batch(micro_batches[-1], store)
    if store is not None and store.pending:  # nothing should be left; flush so .grad is complete anyway
        notes.append(f"flushed {store.pending} wgrad closures left after the last backward")
        store.run_all()
    return notes
