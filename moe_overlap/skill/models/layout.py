"""Pipeline layouts for layer counts that do not split evenly over PP x VPP virtual stages.

Megatron-Core's ``pipeline_model_parallel_layout`` string names what each virtual stage holds, stage by stage,
separated by ``|``: ``E`` the embedding, ``t`` a transformer layer, ``m`` an MTP layer, ``L`` the loss, and
``(...)*n`` a repeat (megatron/core/transformer/pipeline_parallel_layer_layout.py). The stage count fixes VPP:
stages / PP. The layout here follows the one Megatron-Bridge 0.6.2's DeepSeek-V3 H100 performance recipe passes
for PP 8 x VPP 4 (``Et|(tt|)*30mL``, perf_recipes/deepseek/h100/deepseek_v3.py): the last stage holds the MTP
layers and the loss and no transformer layer (they cost about one layer each), the other stages share the
layers as evenly as possible, and the short stages come first, the first one beside the embedding.
"""

from __future__ import annotations


def even_split(num_layers: int, pp: int, vpp: int) -> bool:
    return num_layers % (pp * vpp) == 0


def uneven_layout(num_layers: int, pp: int, vpp: int, mtp_layers: int = 0) -> str | None:
    """The layout string for `num_layers` over pp x vpp stages, or None when no stage would stay non-empty."""
    stages = pp * vpp
    if stages < 2:
        return None
    q, r = divmod(num_layers, stages - 1)
    if q == 0:
        return None  # fewer layers than stages: some stage would hold nothing but E or L
    counts = [q] * (stages - 1 - r) + [q + 1] * r
    parts = [("E" if i == 0 else "") + "t" * n for i, n in enumerate(counts)]
    parts.append("m" * mtp_layers + "L")
    return _compress(parts)


def _compress(parts: list[str]) -> str:
    """`Et|tt|tt|...|mL` with runs of 3 or more equal middle stages written as `(tt|)*n`, Bridge's notation."""
    text, need_sep, i = "", False, 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        run = j - i + 1
        if run > 2 and i > 0 and j < len(parts) - 1:
            text += ("|" if need_sep else "") + f"({parts[i]}|)*{run}"
            need_sep = False  # the repeat ends with its own separator
        else:
            for part in parts[i:j + 1]:
                text += ("|" if need_sep else "") + part
                need_sep = True
        i = j + 1
    return text


def layout_stages(layout: str) -> list[str]:
    """The stages of a layout string, repeats expanded: 'Et|(tt|)*2mL' -> ['Et', 'tt', 'tt', 'mL']."""
    text, out = layout, ""
    while "(" in text:
        start = text.index("(")
        end = text.index(")", start)
        star = end + 2 if text[end + 1:end + 2] == "*" else end + 1
        digits = ""
        while star < len(text) and text[star].isdigit():
            digits += text[star]
            star += 1
        out += text[:start] + text[start + 1:end] * int(digits or 1)
        text = text[star:]
    out += text
    return out.split("|")


def layout_layers(layout: str) -> int:
    """Transformer layers a layout holds."""
    return sum(stage.count("t") for stage in layout_stages(layout))
