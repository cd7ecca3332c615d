"""What each rank of benchmarks/peers/peers.py runs: the same MoE layer problem through every implementation,
checked against each other, then timed in the same process.

Shape legend: T tokens per rank, D hidden, F expert ffn, E global experts, K top-k, L = E / R local experts.

Per preset, on every rank:
  1. full weights, fp32, drawn on the device from the seed (identical on every rank): router [E, D] ~ N(0, 1/D),
     w1 [E, D, 2F] ~ N(0, 1/D), w2 [E, F, D] ~ N(0, 1/F); each implementation gets the router and this rank's
     L experts (global experts rank*L .. rank*L + L - 1), cast to bf16. Input x [T, D] and the upstream
     gradient g [T, D] from seed + rank.
  2. agreement (untimed): one forward + backward of each implementation; relative L2 distance of the output,
     the input gradient and the router / expert weight gradients to ours (bf16) and to our layer run in
     float32 on the same weights (the reference); the maximum over ranks.
  3. timing: rounds of [each implementation: forward, then forward + backward], interleaved so drift hits all
     alike; each call starts after an all-rank barrier; CUDA events on the current stream (host clock on CPU);
     the first ``warmup`` rounds are dropped; per round the slowest rank's time, then the median over rounds.
     The forward is the training forward (autograd records, the graph is dropped unused).
An implementation that fails to build or run on any rank is dropped on every rank and its error kept.
"""

from __future__ import annotations

import importlib.metadata
import math
import traceback

import torch
import torch.distributed as dist

from benchmarks.common.timing import Clock

GRAD_KEYS = ("router.weight", "experts.w1", "experts.w2")
COMPARED = ("out", "dx") + GRAD_KEYS


def full_weights(shape: dict, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """The full fp32 weights, drawn on ``device`` (a host draw of 1.4 G values would take a minute)."""
    D, F, E = shape["hidden"], shape["ffn"], shape["experts"]
    gen = torch.Generator(device=device).manual_seed(seed)
    return {"router.weight": torch.randn(E, D, generator=gen, device=device) / math.sqrt(D),
            "experts.w1": torch.randn(E, D, 2 * F, generator=gen, device=device) / math.sqrt(D),
            "experts.w2": torch.randn(E, F, D, generator=gen, device=device) / math.sqrt(F)}


class Ours:
    """Our MoELayer with one schedule; the interface every implementation here has."""

    def __init__(self, shape, group, device, dtype, schedule="none", chunks=1, stream=None):
        from moe_overlap.ep.layer import MoELayer

        self.layer = MoELayer(shape["hidden"], shape["ffn"], shape["experts"], shape["topk"], group,
                              normalize=True, force_balance=True, dtype=dtype, device=device, seed=None)
        self.schedule, self.chunks, self.stream = schedule, chunks, stream
        self.notes: list[str] = []

    def load(self, router_ED, w1_LD2F, w2_LFD) -> None:
        with torch.no_grad():
            self.layer.router.weight.copy_(router_ED)
            self.layer.experts.w1.copy_(w1_LD2F)
            self.layer.experts.w2.copy_(w2_LFD)

    def __call__(self, x_TD):
        return self.layer(x_TD, schedule=self.schedule, chunks=self.chunks, comm_stream=self.stream)[0]

    def backward(self, out_TD, grad_TD) -> None:
        out_TD.backward(grad_TD)

    def zero_grad(self) -> None:
        self.layer.zero_grad(set_to_none=True)

    def grads(self) -> dict[str, torch.Tensor]:
        return {"router.weight": self.layer.router.weight.grad, "experts.w1": self.layer.experts.w1.grad,
                "experts.w2": self.layer.experts.w2.grad}

    def describe(self) -> dict:
        return {"module": "moe_overlap.ep.layer.MoELayer", "schedule": self.schedule, "chunks": self.chunks,
                "routing": "force_balance=True, softmax, normalize=True",
                "dtype": str(self.layer.experts.w1.dtype).replace("torch.", "")}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (0.0 = equal); inf when the shapes differ."""
    if a is None or b is None or a.shape != b.shape:
        return math.inf
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(got: dict, ref: dict) -> dict[str, float]:
    return {k: rel_l2(got.get(k), ref.get(k)) for k in COMPARED}


def run_once(impl, x_TD: torch.Tensor, g_TD: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward + backward; the output and every gradient, detached."""
    impl.zero_grad()
    x = x_TD.detach().clone().requires_grad_(True)
    out = impl(x)
    impl.backward(out, g_TD)
    res = {"out": out.detach(), "dx": x.grad, **{k: v.detach() for k, v in impl.grads().items()}}
    impl.zero_grad()
    return res


def all_ok(ok: bool, group, device) -> bool:
    """True only if ``ok`` on every rank (so all ranks keep or drop an implementation together)."""
    flag = torch.tensor([1.0 if ok else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item() == 1.0)


def worst_over_ranks(table: dict[str, dict[str, float]], group, device) -> dict[str, dict[str, float]]:
    keys = [(a, b) for a in sorted(table) for b in COMPARED]  # same order on every rank
    t = torch.tensor([min(table[a][b], 1e30) for a, b in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    out: dict[str, dict[str, float]] = {}
    for (a, b), v in zip(keys, t.cpu().tolist(), strict=True):
        out.setdefault(a, {})[b] = v
    return out


def _build(name, shape, rank, world, group, device, dtype, opts, stream):
    if name == "ours" or name.startswith("ours "):
        schedule, _, chunks = (name.split(" ", 1)[1] if " " in name else "none").partition(":")
        return Ours(shape, group, device, dtype, schedule, int(chunks or 1), stream if schedule != "none" else None)
    if name == "torchtitan":
        from benchmarks.peers.peers_titan import TitanMoE

        return TitanMoE(shape, rank, world, device, dtype, opts["titan_backend"])
    if name == "megatron":
        from benchmarks.peers.peers_megatron import MegatronMoE

        return MegatronMoE(shape, world, device, dtype, opts["megatron"])
    raise ValueError(f"unknown implementation {name!r}")


def _peak_extra_bytes(fn, device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def _fwd(impl, x):
    return lambda: impl(x)


def _fwd_bwd(impl, x, g):
    def fn():
        impl.zero_grad()
        x.grad = None
        impl.backward(impl(x), g)
    return fn


def time_impls(impls: dict, x, g, clock, rounds: int, device) -> dict:
    """Interleaved rounds of every implementation's forward and forward + backward; then one more
    forward + backward each for its peak memory."""
    xr = x.detach().clone().requires_grad_(True)
    for r in range(rounds):
        clock.round = r
        for name, impl in impls.items():
            clock(f"{name}/fwd", _fwd(impl, xr))
            clock(f"{name}/fwd+bwd", _fwd_bwd(impl, xr, g))
    times = clock.summary()
    rows = {}
    for name, impl in impls.items():
        rows[name] = {"fwd": times[f"{name}/fwd"], "fwd_bwd": times[f"{name}/fwd+bwd"],
                      "peak_extra_bytes_fwd_bwd": _peak_extra_bytes(_fwd_bwd(impl, xr, g), device),
                      "describe": impl.describe(), "notes": list(getattr(impl, "notes", []))}
        impl.zero_grad()
    return rows


def run_preset(name, shape, rank, world, group, device, opts) -> dict:
    from moe_overlap.ep.layer import shard_full_weights
    from moe_overlap.ep.streams import make_comm_stream

    dtype = torch.bfloat16
    full = shard_full_weights(full_weights(shape, device, opts["seed"]), rank, world)
    gen = torch.Generator(device=device).manual_seed(opts["seed"] + 1000 + rank)
    x = torch.randn(shape["tokens"], shape["hidden"], generator=gen, device=device).to(dtype)
    g = torch.randn(shape["tokens"], shape["hidden"], generator=gen, device=device).to(dtype)
    weights = [full[k] for k in GRAD_KEYS]  # router [E, D], this rank's w1 [L, D, 2F], w2 [L, F, D]
    stream = make_comm_stream(device)
    impls, errors, agreement = {}, {}, {}
    ref = None
    if opts["fp32_reference"]:
        ref_impl = Ours(shape, group, device, torch.float32)
        ref_impl.load(*weights)
        ref = run_once(ref_impl, x.float(), g.float())  # the bf16 inputs, exactly, in fp32
        del ref_impl
    ours_res = None
    for impl_name in opts["impls"]:
        impl, err = None, None
        try:
            impl = _build(impl_name, shape, rank, world, group, device, dtype, opts, stream)
            impl.load(*(w.to(dtype) for w in weights))
            res = run_once(impl, x, g)
        except Exception as exc:  # noqa: BLE001 - recorded in the results, the other implementations go on
            err = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
        if not all_ok(err is None, group, device):
            errors[impl_name] = err or "failed on another rank"
            continue
        impls[impl_name] = impl
        if ours_res is None and impl_name == "ours":
            ours_res = res
        agreement[impl_name] = {"vs_ours": compare(res, ours_res) if ours_res is not None else None,
                                "vs_fp32": compare(res, ref) if ref is not None else None}
        del res
    table = {f"{n}|{k}": v for n, a in agreement.items() for k, v in a.items() if v is not None}
    worst = worst_over_ranks(table, group, device) if table else {}
    for key, vals in worst.items():
        impl_name, against = key.split("|")
        agreement[impl_name][against] = vals
    del ours_res, ref

    rows = time_impls(impls, x, g, Clock(group, device, opts["warmup"]), opts["warmup"] + opts["rounds"], device)
    out = {"preset": name, "shape": shape, "local_experts": shape["experts"] // world, "impls": rows,
           "errors": errors, "agreement_rel_l2": agreement,
           "expert_path_ours": impls["ours"].layer.expert_path(x) if "ours" in impls else None}
    del impls, full, weights, x, g
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def peers_body(rank, world, group, presets, device_type, opts) -> dict:
    """Runs in every rank: every preset in turn. Returns this rank's results (agreement: worst rank)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    results = [run_preset(name, shape, rank, world, group, device, opts) for name, shape in presets]
    nccl = torch.cuda.nccl.version() if device_type == "cuda" else None
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
                **{k: _version(k) for k in ("triton", "torchtitan", "spmd_types", "megatron-core", "grouped_gemm")}}
    return {"results": results, "versions": versions, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device_type == "cuda" else None}
