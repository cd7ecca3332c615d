"""Two-stream timelines of one MoE layer's nodes, for the estimator (torch-free).

A schedule is a list of tasks. Each task runs on one resource, ``compute`` or ``comm``; tasks on a resource
run in the order they were added (one CUDA stream each, or the rank's main thread and the async
all-to-all on CPU), and a task starts when its resource is free and all its dependencies have finished.
The makespan of that list is the step time if communication never slows computation down
(``ideal``). ``serial`` is the sum of all durations (nothing overlaps). Real machines sit between
the two: :func:`blend` interpolates with an overlap efficiency measured by the calibration.

Node names follow Megatron-Core's EP-overlap split of a layer (megatron/core/models/common/
model_chunk_schedule_plan.py, TransformerLayerSchedulePlan): ``pre`` (attention,
router, permute), ``dispatch`` (all-to-all), ``mlp`` (expert GEMMs), ``combine`` (all-to-all), ``post``
(unpermute, weighted sum). Suffix ``_f`` forward, ``_b`` backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_SIMULATED_PAIRS = 200_000  # about 3 s of Python; a steady state appears within a few micro-batches


class TimelineTooLong(ValueError):
    """A schedule would take longer to simulate than an estimate may (never seen: steady states appear early)."""


@dataclass(frozen=True)
class NodeTimes:
    """Durations (ms) of one layer's nodes for one micro-batch (whole layer, not per chunk)."""

    pre_f: float
    mlp_f: float
    post_f: float
    post_b: float
    dgrad_b: float
    wgrad_b: float
    wgrad_fixed: float  # paid by every weight-gradient pass whatever its rows (writes all weight grads)
    pre_b: float
    a2a: float  # one all-to-all (dispatch or combine, either pass) without its fixed latency
    a2a_latency: float  # fixed cost of one all-to-all
    count_exchange: float  # fixed cost of the forward dispatch's token-count exchange


@dataclass
class Timeline:
    """Tasks on two in-order resources; ``add`` returns the task's finish time.

    ``wave`` > 0: the all-to-all takes SMs (NCCL at SM margin 0), so an expert GEMM added with ``gemm`` that runs
    from its start beside an all-to-all in flight is stretched by ``wave`` x min(the all-to-all's time left, the
    GEMM's time): torch's persistent grouped GEMM sizes its grid to every SM, and its blocks that find none wait
    until the all-to-all ends or an early block has done its share (a second wave; measured on one H200 beside a
    kernel holding SMs, skill/estimate/costs.py SECOND_WAVE). That holds whichever was added first: an
    all-to-all issued after the GEMM but ready when it starts gets the SMs first (the comm stream's priority,
    ep/streams.py). The stretch is not work: ``busy`` (and so ``serial``) keeps the GEMM's own time. A task that
    depends on a GEMM stretched after ``gemm`` returned its end waits for the stretched end (``moved``)."""

    free: dict[str, float] = field(default_factory=lambda: {"compute": 0.0, "comm": 0.0})
    busy: dict[str, float] = field(default_factory=lambda: {"compute": 0.0, "comm": 0.0})
    wave: float = 0.0
    comm_spans: list[tuple[float, float]] = field(default_factory=list)  # the last few all-to-alls
    last_gemm: tuple[float, float, float] | None = None  # (start, own time, stretch) while it ends the stream
    moved: dict[float, float] = field(default_factory=dict)  # end gemm() returned -> its end now (last few GEMMs)

    def _start(self, resource: str, deps: tuple[float, ...]) -> float:
        return max([self.free[resource], *(self.moved.get(d, d) for d in deps)])

    def add(self, resource: str, duration: float, *deps: float) -> float:
        start = self._start(resource, deps)
        end = start + duration
        self.free[resource] = end
        self.busy[resource] += duration
        if self.wave:
            if resource == "comm":
                self.comm_spans = [*self.comm_spans[-3:], (start, end)]
                self._stretch_last(start, end)
            else:
                self.last_gemm = None  # a later compute task: the GEMM's end is fixed
        return end

    def gemm(self, duration: float, *deps: float) -> float:
        """An expert GEMM on the compute stream (``add`` when ``wave`` is 0)."""
        if not self.wave:
            return self.add("compute", duration, *deps)
        start = self._start("compute", deps)
        left = max([c1 - start for c0, c1 in self.comm_spans if c0 <= start < c1] or [0.0])
        stretch = self.wave * min(left, duration)
        self.free["compute"] = start + duration + stretch
        self.busy["compute"] += duration
        self.last_gemm = (start, duration, stretch)
        self.moved = {k: v for k, v in list(self.moved.items())[-3:]}
        self.moved[self.free["compute"]] = self.free["compute"]
        return self.free["compute"]

    def _stretch_last(self, c0: float, c1: float) -> None:
        if self.last_gemm is None:
            return
        g0, own, done = self.last_gemm
        if c0 <= g0 + 1e-12 and g0 < c1 and (s := self.wave * min(c1 - g0, own)) > done:
            returned = next(reversed(self.moved))  # the last GEMM's entry: gemm() added it last
            self.free["compute"] += s - done
            self.moved[returned] = self.free["compute"]
            self.last_gemm = (g0, own, s)

    def shift(self, by: float) -> None:
        """Move the stream state by `by` ms (the steady-state extrapolation's jump)."""
        self.free = {k: v + by for k, v in self.free.items()}
        self.comm_spans = [(a + by, b + by) for a, b in self.comm_spans]
        self.moved = {k + by: v + by for k, v in self.moved.items()}
        if self.last_gemm is not None:
            self.last_gemm = (self.last_gemm[0] + by, *self.last_gemm[1:])

    @property
    def makespan(self) -> float:
        return max(self.free.values())

    @property
    def serial(self) -> float:
        return self.busy["compute"] + self.busy["comm"]


def blend(tl: Timeline, overlap_efficiency: float) -> float:
    """Step time between fully serial (efficiency 0) and the ideal two-stream makespan (efficiency 1)."""
    return tl.serial - overlap_efficiency * (tl.serial - tl.makespan)


def _forward(tl: Timeline, n: NodeTimes, after: float, chunks: int) -> float:
    """One layer's forward; ``chunks`` > 1 pipelines dispatch c+1 | experts c | combine c-1."""
    t = tl.add("compute", n.pre_f, after)
    t = tl.add("comm", n.count_exchange, t)  # split sizes must be known before any chunk is sent
    c_a2a = n.a2a / chunks + n.a2a_latency
    disp = [0.0] * chunks
    mlp_end: list[float] = []
    comb_end: list[float] = []
    disp[0] = tl.add("comm", c_a2a, t)
    for c in range(chunks):
        if c + 1 < chunks:
            disp[c + 1] = tl.add("comm", c_a2a, t)
        mlp_end.append(tl.add("compute", n.mlp_f / chunks, disp[c]))
        comb_end.append(tl.add("comm", c_a2a, mlp_end[c]))
    return tl.add("compute", n.post_f, *comb_end)


def _backward(tl: Timeline, n: NodeTimes, after: float, chunks: int) -> float:
    t = tl.add("compute", n.post_b, after)
    c_a2a = n.a2a / chunks + n.a2a_latency
    comb = [0.0] * chunks
    ends: list[float] = []
    comb[0] = tl.add("comm", c_a2a, t)
    for c in range(chunks):
        if c + 1 < chunks:
            comb[c + 1] = tl.add("comm", c_a2a, t)
        if chunks == 1:  # plain autograd: the experts' node computes dgrad and wgrad before passing on
            m = tl.add("compute", n.dgrad_b + n.wgrad_b + n.wgrad_fixed, comb[c])
            ends.append(tl.add("comm", c_a2a, m))
        else:  # chunked: the grad all-to-all of chunk c starts after its dgrad; its wgrad runs beside it
            m = tl.add("compute", n.dgrad_b / chunks, comb[c])
            ends.append(tl.add("comm", c_a2a, m))
            tl.add("compute", n.wgrad_b / chunks + n.wgrad_fixed, m)
    return tl.add("compute", n.pre_b, *ends)


def layer_timeline(n: NodeTimes, chunks: int = 1, chunk_backward: bool = True) -> Timeline:
    """Forward then backward of one layer for one micro-batch (schedules ``none`` and ``chunked``)."""
    tl = Timeline()
    t = _forward(tl, n, 0.0, chunks)
    _backward(tl, n, t, chunks if chunk_backward else 1)
    return tl


def one_f_one_b_timeline(n: NodeTimes, layers: int, micro_batches: int, delay_wgrad: bool, *,
                         extrapolate: bool = True, wgrad_delay_cost: float = 0.0,
                         pair: NodeTimes | None = None, second_wave: float = 0.0) -> Timeline:
    """Megatron-Core's cross-micro-batch overlap (model_chunk_schedule_plan.py) for a stack of identical layers.

    Forward of micro-batch k+1 runs with backward of micro-batch k, forward layer i paired with backward
    layer L-1-i; the first forward and the last backward run alone. Per layer pair the compute stream
    runs b.post, f.pre, b.dgrad, [b.wgrad], f.mlp, b.pre, f.post and the comm stream b.combine,
    f.dispatch, b.dispatch, f.combine. Without delayed wgrad the backward dispatch waits for dgrad and
    wgrad; with it, only for dgrad, and wgrad runs beside the dispatch.

    Work is bounded whatever `micro_batches`: the schedule is a max-plus system, so once the state (both
    resources' free times, the last forward and backward finish) moves by the same amount in every component
    over some period of micro-batches, every later period moves by that amount too; the rest is added in one
    step (`extrapolate=False` runs every micro-batch, for the test that both agree).

    `pair`: the node times inside a layer pair where they differ from the lone forward / backward (the expert
    GEMMs on fewer SMs with an SM margin); None: the same. `second_wave`: the pair's expert GEMMs beside an
    all-to-all that holds SMs are stretched so (Timeline.wave); 0 for copy engines and with an SM margin.
    """
    p = pair or n
    tl = Timeline(wave=second_wave)
    a2a = n.a2a + n.a2a_latency
    t = 0.0
    for _ in range(layers):  # first forward, alone
        t = _forward(tl, n, t, 1)
    f_done, b_grad = t, t
    # the delayed wgrad pass takes (1 + wgrad_delay_cost) of its time: it re-reads its stored inputs and runs
    # beside the backward dispatch (skill/estimate/costs.py, DELAYED_WGRAD_COST)
    late_wgrad = (p.wgrad_b + p.wgrad_fixed) * (1.0 + wgrad_delay_cost)

    def pair_loop(f_done: float, b_grad: float) -> tuple[float, float]:
        for _ in range(layers):
            b_post = tl.add("compute", p.post_b, b_grad)
            b_comb = tl.add("comm", a2a, b_post)
            f_pre = tl.add("compute", p.pre_f, f_done)
            if delay_wgrad:
                b_d = tl.gemm(p.dgrad_b, b_comb)
                tl.gemm(late_wgrad, b_d)
            else:
                b_d = tl.gemm(p.dgrad_b + p.wgrad_b + p.wgrad_fixed, b_comb)
            f_cnt = tl.add("comm", p.count_exchange, f_pre)
            f_disp = tl.add("comm", a2a, f_cnt)
            b_disp = tl.add("comm", a2a, b_d)
            f_mlp = tl.gemm(p.mlp_f, f_disp)
            f_comb = tl.add("comm", a2a, f_mlp)
            b_grad = tl.add("compute", p.pre_b, b_disp)
            f_done = tl.add("compute", p.post_f, f_comb)
        return f_done, b_grad

    history: list[tuple[float, ...]] = []
    left = micro_batches - 1
    pairs = 0
    while left > 0:
        f_done, b_grad = pair_loop(f_done, b_grad)
        left -= 1
        pairs += layers
        if pairs > MAX_SIMULATED_PAIRS:
            raise TimelineTooLong(f"the 1f1b schedule of {layers} layers x {micro_batches} micro-batches did not "
                                  f"settle into a steady state within {MAX_SIMULATED_PAIRS} layer pairs")
        history.append((tl.free["compute"], tl.free["comm"], f_done, b_grad, tl.busy["compute"], tl.busy["comm"]))
        period = _period(history) if extrapolate and left else None
        if period is not None:
            now, before = history[-1], history[-1 - period]
            jumps = left // period
            shift = (now[0] - before[0]) * jumps
            tl.shift(shift)  # history[-1] is the state now: both streams (and the spans) move by one shift
            tl.busy = {"compute": now[4] + (now[4] - before[4]) * jumps, "comm": now[5] + (now[5] - before[5]) * jumps}
            f_done, b_grad = now[2] + shift, now[3] + shift
            left -= jumps * period
            history.clear()
    t = max(f_done, b_grad)
    for _ in range(layers):  # last backward, alone
        t = _backward(tl, n, t, 1)
    return tl


def _period(history: list[tuple[float, ...]], max_period: int = 4) -> int | None:
    """The smallest p <= max_period over which the last two periods moved every state component by one and the
    same amount (and the busy times by the same amounts), or None."""
    for p in range(1, max_period + 1):
        if len(history) < 2 * p + 1:
            return None
        a, b, c = history[-1], history[-1 - p], history[-1 - 2 * p]
        step = a[0] - b[0]
        scale = max(1.0, abs(a[0]))
        if all(abs((a[i] - b[i]) - step) <= 1e-12 * scale and abs((b[i] - c[i]) - step) <= 1e-12 * scale
               for i in range(4)) and all(abs((a[i] - b[i]) - (b[i] - c[i])) <= 1e-12 * max(1.0, abs(a[i]))
                                          for i in (4, 5)):
            return p
    return None
