"""What Megatron-Bridge 0.6.2's recipe for this model, GPU and scale would choose, where the request leaves it open.

The recipe table is moe_overlap/skill/models/recipes.py (each value re-read from the wheel by a test). Used for:

    TP, EP, micro/global batch  from the recipe of this model at exactly this GPU count and PP (its GPU family,
                                H100 when no GPU is given: Bridge's base recipes are H100 ones)
    VPP and the pipeline layout from a recipe of this model at this PP that sets VPP (DeepSeek-V3 PP 8: the
                                1024-GPU H100 perf recipe's VPP 4 and ``Et|(tt|)*30mL``), else the smallest even VPP
    dispatcher and backend      from the nearest recipe for this GPU family; only when the GPU is given
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_overlap.skill.models.recipes import Recipe, nearest, recipes_for, with_virtual_pipeline

DEFAULT_MICRO_BATCHES = 8  # per DP rank, PP 1: the first forward and the last backward run alone, 7 of 8 pair


@dataclass
class Upstream:
    exact: Recipe | None = None  # same model, GPU count, PP (and family)
    near: Recipe | None = None  # nearest for the dispatcher
    vpp_from: Recipe | None = None
    notes: list[str] = field(default_factory=list)


def find(model: str | None, family: str | None, gpus: int | None, pp: int) -> Upstream:
    if model is None:
        return Upstream()
    pool = recipes_for(model, family or "H100")
    exact = next((r for r in pool if r.gpus == gpus and r.pp == pp), None) if gpus else None
    return Upstream(exact=exact, near=nearest(model, family, gpus, pp) if family else None,
                    vpp_from=with_virtual_pipeline(model, pp, family) if pp > 1 else None)


def default_tp(up: Upstream, requested: int | None, gpus: int | None, pp: int) -> int:
    if requested is not None:
        return requested
    if up.exact and (gpus is None or gpus % (up.exact.tp * pp) == 0):
        up.notes.append(f"TP {up.exact.tp} as in {up.exact.where}")
        return up.exact.tp
    return 1


def default_micro_batches(up: Upstream, requested: int | None, dp: int, pp: int, ep: int,
                          tp: int) -> tuple[int, int]:
    """(micro_batch_size, micro-batches per DP rank): the recipe's when the layout is the recipe's, else 1 and
    8 (PP 1) or 4 x PP (enough to fill the pipeline and keep the count a multiple of PP)."""
    r = up.exact
    if requested is not None:
        return (r.mbs if r else 1), requested
    if r and r.tp == tp and r.ep == ep and r.gbs % (r.mbs * dp) == 0:
        up.notes.append(f"micro_batch_size {r.mbs}, global_batch_size {r.gbs} as in {r.where}")
        return r.mbs, r.gbs // (r.mbs * dp)
    return 1, DEFAULT_MICRO_BATCHES if pp == 1 else 4 * pp


def default_dispatcher(up: Upstream, requested: str | None, model: str | None,
                       gpu_given: bool) -> tuple[str, str | None]:
    """(dispatcher, preferred flex backend)."""
    r = up.exact if up.exact and gpu_given else up.near
    if requested is not None:
        return requested, (r.backend if r else None)
    if r is not None:
        up.notes.append(f"dispatcher {r.dispatcher}{f' + {r.backend}' if r.backend else ''} as in {r.where} "
                        f"({r.gpus}x {r.gpu})")
        return r.dispatcher, r.backend
    if model and not gpu_given and (h := nearest(model, "H100", None)) is not None and h.dispatcher == "flex":
        up.notes.append(f"dispatcher alltoall (correctness first); Megatron-Bridge's H100 recipe {h.function} "
                        f"uses flex + {h.backend}: give --gpu to follow your GPU's recipe, or take the flex stage")
    return "alltoall", None
