"""The virtual pipeline of a generated config: EP overlap with PP > 1 needs VPP (rule pp-requires-vpp), and a layer
count that does not split evenly over PP x VPP stages needs a pipeline layout (as Megatron-Bridge's DeepSeek-V3
recipes do: 61 layers at PP 8 / VPP 4 with ``Et|(tt|)*30mL``).

Order of choice: the VPP asked for; else the VPP of Bridge's recipe for this model at this PP; else the smallest
VPP >= 2 that splits the layers evenly; else the smallest VPP >= 2 with a layout. A refusal (with the nearest PP
that works) only when no layout can hold the layers (fewer layers than stages).
"""

from __future__ import annotations

from typing import Any

from moe_overlap.skill.models.layout import even_split, layout_layers, layout_stages, uneven_layout
from moe_overlap.skill.models.recipes import Recipe


def vpp_choices(num_layers: int, pp: int) -> list[int]:
    """VPP sizes >= 2 that split `num_layers` evenly over pp x vpp virtual stages."""
    return [v for v in range(2, num_layers // pp + 1) if num_layers % (pp * v) == 0]


def _layout_for(layers: int, pp: int, vpp: int, mtp: int, recipe: Recipe | None) -> str | None:
    if recipe is not None and recipe.layout and recipe.layout != "default-layout-map" and recipe.vpp == vpp:
        stages = layout_stages(recipe.layout)
        if (len(stages) == pp * vpp and layout_layers(recipe.layout) == layers
                and sum(s.count("m") for s in stages) == mtp):
            return recipe.layout
    return uneven_layout(layers, pp, vpp, mtp)


def choose(req, layers: int, mtp: int, recipe: Recipe | None) -> tuple[dict[str, Any], list[tuple], list[tuple]]:
    """({vpp, layout}, adjustments, refusals): adjustments and refusals as (field, requested, used, rule, reason) /
    (rule, reason, nearest) tuples for the resolver to wrap."""
    pp = req.pp
    adjustments: list[tuple] = []
    refusals: list[tuple] = []
    even = vpp_choices(layers, pp)
    if req.vpp is not None:
        if req.vpp in even:
            return {"vpp": req.vpp, "layout": None}, adjustments, refusals
        layout = uneven_layout(layers, pp, req.vpp, mtp) if req.vpp >= 2 else None
        if layout is not None:
            adjustments.append(("pipeline_model_parallel_layout", None, layout, "pp-requires-vpp", (
                f"{layers} layers do not split evenly over pp={pp} x vpp={req.vpp}: a pipeline layout places them "
                "(E embedding, t layer, m MTP, L loss; the last stage holds MTP and loss)")))
            return {"vpp": req.vpp, "layout": layout}, adjustments, refusals
        refusals.append(("pp-requires-vpp", f"vpp={req.vpp} cannot hold {layers} layers over pp={pp} "
                         f"(valid: {even or 'none'})", {"vpp": min(even, key=lambda v: (abs(v - req.vpp), v))
                                                        if even else None}))
        return {"vpp": None, "layout": None}, adjustments, refusals
    if recipe is not None and recipe.vpp:
        layout = None if even_split(layers, pp, recipe.vpp) else _layout_for(layers, pp, recipe.vpp, mtp, recipe)
        if even_split(layers, pp, recipe.vpp) or layout is not None:
            why = f"as in {recipe.where}" + (f", with pipeline_model_parallel_layout {layout}" if layout else "")
            adjustments.append(("vpp", None, recipe.vpp, "pp-requires-vpp",
                                f"EP overlap with pp > 1 needs the interleaved schedule: VPP {recipe.vpp} {why}"))
            return {"vpp": recipe.vpp, "layout": layout}, adjustments, refusals
    if even:
        adjustments.append(("vpp", None, even[0], "pp-requires-vpp", (
            f"EP overlap with pp > 1 needs the interleaved schedule: VPP {even[0]} is the smallest size that "
            f"splits {layers} layers evenly over {pp} x VPP stages")))
        return {"vpp": even[0], "layout": None}, adjustments, refusals
    for vpp in range(2, max(3, layers // pp + 1)):
        layout = uneven_layout(layers, pp, vpp, mtp)
        if layout is not None:
            adjustments.append(("vpp", None, vpp, "pp-requires-vpp", (
                f"EP overlap with pp > 1 needs the interleaved schedule; {layers} layers split evenly over no "
                f"{pp} x VPP stages, so VPP {vpp} with pipeline_model_parallel_layout {layout}")))
            return {"vpp": vpp, "layout": layout}, adjustments, refusals
    smaller = [p for p in range(pp - 1, 0, -1) if (p == 1 or uneven_layout(layers, p, 2, mtp) or vpp_choices(layers, p))
               and (req.gpus is None or req.gpus % p == 0)]  # a PP the GPU count allows
    refusals.append(("pp-requires-vpp", (
        f"pp={pp} with {layers} layers leaves no room for a virtual pipeline (VPP >= 2 needs at least "
        f"pp x 2 - 1 = {2 * pp - 1} layers), and EP overlap with pp > 1 needs one"), {"pp": smaller[0], "vpp": None}))
    return {"vpp": None, "layout": None}, adjustments, refusals
