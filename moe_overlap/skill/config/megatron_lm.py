"""Megatron-LM's reading of its own flags: the defaults and derivations of ``megatron/training/arguments.py``
(``validate_args``) that the EP-overlap rules depend on, so that ``validate --argv`` sees what Megatron-LM sees.

- the VPP size: from ``--num-layers-per-virtual-pipeline-stage`` (layers / PP / layers per stage), from
  ``--num-virtual-stages-per-pipeline-rank``, or from ``--pipeline-model-parallel-layout`` (stages / PP); a VPP of
  1 becomes None (no interleaving), and at most one of the three may be given;
- the layer splits Megatron-LM asserts (layers divisible by PP, per-stage layers dividing the layers per rank,
  layout stages divisible by PP) and the interleaved schedule's PP > 1 (> 2 with ``--no-overlap-p2p-communication``);
- defaults that differ from an unset TransformerConfig field: gradient_accumulation_fusion on (off only with
  ``--no-gradient-accumulation-fusion``), transformer_impl transformer_engine.

Checked against each release's own parse_args -> validate_args (tests/oracle/mlm.py). Nothing here imports
Megatron; messages name the flags a user edits.
"""

from __future__ import annotations

import re
from typing import Any

# Field values Megatron-LM's argparse gives when a flag is absent (where they matter to a rule).
DEFAULTS = {"gradient_accumulation_fusion": True, "transformer_impl": "transformer_engine"}
VPP_FLAGS = {"num_layers_per_virtual_pipeline_stage": "--num-layers-per-virtual-pipeline-stage",
             "num_virtual_stages_per_pipeline_rank": "--num-virtual-stages-per-pipeline-rank",
             "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout"}
MAX_LAYOUT = 4096  # characters; far above any real layout, and the unrolled text is bounded too
MAX_UNROLLED = 1 << 16

Note = tuple[str, str, str]  # (kind, path, message): kind "derived-value" (info) or "layer-split" (error)


def layout_stages(layout: str) -> list[str] | None:
    """The stages of a layout string as Megatron-Core's PipelineParallelLayerLayout splits it ('Ettt|(tt|)*2,L'
    -> ['Ettt', 'tt', 'tt', 'L']): commas dropped, '(...)*n' and 'x*n' unrolled, split at '|'. None when the
    text is too long to be a layout."""
    if len(layout) > MAX_LAYOUT:
        return None
    text = layout.replace(",", "")
    budget = [MAX_UNROLLED]  # characters all unrolling together may produce: a layout is short

    def unroll(m: re.Match) -> str:
        count = int(m.group(2)) if len(m.group(2)) <= 7 else MAX_UNROLLED + 1
        budget[0] -= len(m.group(1)) * count
        if budget[0] < 0:
            raise OverflowError
        return m.group(1) * count

    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        try:
            text = re.sub(pattern, unroll, text)
        except OverflowError:
            return None
    return text.split("|")


def _layers(model: dict, extra: dict) -> int | None:
    layers = model.get("num_layers")
    if layers is None:
        return None
    return layers + bool(extra.get("account_for_embedding_in_pipeline_split")) + bool(
        extra.get("account_for_loss_in_pipeline_split"))


def _vpp(model: dict, extra: dict, pp: int, notes: list[Note]) -> tuple[int | None, bool]:
    """The VPP size Megatron-LM derives, and whether it could be derived (False: --num-layers missing)."""
    layout = model.get("pipeline_model_parallel_layout")
    per_stage = model.get("num_layers_per_virtual_pipeline_stage")
    stages_per_rank = model.get("num_virtual_stages_per_pipeline_rank")
    layers = _layers(model, extra)
    if layout is not None:
        stages = layout_stages(str(layout))
        if stages is None:
            notes.append(("layer-split", "model.pipeline_model_parallel_layout", "--pipeline-model-parallel-layout "
                          "is too long to be a layout"))
            return None, True
        if len(stages) % pp:
            notes.append(("layer-split", "model.pipeline_model_parallel_layout", (
                f"--pipeline-model-parallel-layout has {len(stages)} stages, not divisible by "
                f"--pipeline-model-parallel-size {pp}: Megatron-LM asserts 'The length of "
                "pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size'")))
            return None, True
        vpp, why = len(stages) // pp, f"--pipeline-model-parallel-layout ({len(stages)} stages / PP {pp})"
    elif per_stage is not None and stages_per_rank is None:
        if extra.get("decoder_first_pipeline_num_layers") is not None or extra.get(
                "decoder_last_pipeline_num_layers") is not None:
            notes.append(("layer-split", "model.num_layers_per_virtual_pipeline_stage", (
                "--num-layers-per-virtual-pipeline-stage cannot be used with uneven pipeline stages "
                "(--decoder-first/last-pipeline-num-layers): Megatron-LM asks for "
                "--num-virtual-stages-per-pipeline-rank")))
            return None, True
        if layers is None:
            return None, False
        if layers % pp:
            notes.append(("layer-split", "model.num_layers", (
                f"{layers} layers are not divisible by --pipeline-model-parallel-size {pp}: Megatron-LM asserts "
                "'number of layers of the model must be divisible pipeline model parallel size'")))
            return None, True
        if (layers // pp) % per_stage:
            notes.append(("layer-split", "model.num_layers_per_virtual_pipeline_stage", (
                f"{layers // pp} layers per pipeline rank ({layers} / PP {pp}) are not divisible by "
                f"--num-layers-per-virtual-pipeline-stage {per_stage}: Megatron-LM asserts 'number of layers per "
                "pipeline stage must be divisible number of layers per virtual pipeline stage'")))
            return None, True
        vpp = layers // pp // per_stage
        why = f"--num-layers-per-virtual-pipeline-stage ({layers} layers / PP {pp} / {per_stage} per stage)"
    elif stages_per_rank is not None:
        vpp, why = stages_per_rank, "--num-virtual-stages-per-pipeline-rank"
    else:
        uneven = extra.get("decoder_first_pipeline_num_layers") is not None or extra.get(
            "decoder_last_pipeline_num_layers") is not None
        if layers is not None and not uneven and layers % pp:
            notes.append(("layer-split", "model.num_layers", (
                f"{layers} layers are not divisible by --pipeline-model-parallel-size {pp}: Megatron-LM asserts "
                "'Number of layers should be divisible by the pipeline-model-parallel size'")))
        return None, True
    if vpp == 1:
        notes.append(("derived-value", "model.virtual_pipeline_model_parallel_size", (
            f"VPP 1 from {why}: Megatron-LM sets a VPP of 1 to None (no interleaved schedule)")))
        return None, True
    notes.append(("derived-value", "model.virtual_pipeline_model_parallel_size", f"VPP {vpp} from {why}"))
    return vpp, True


def apply(sections: dict[str, dict[str, Any]], extra: dict[str, Any]) -> list[Note]:
    """Turn the flags read into what Megatron-LM's validate_args leaves (in place), and report what it did.

    `extra` holds flags that only these derivations read (layer accounting, uneven stages, p2p overlap)."""
    model = sections.setdefault("model", {})
    notes: list[Note] = []
    for name, value in DEFAULTS.items():
        model.setdefault(name, value)
    given = [flag for name, flag in VPP_FLAGS.items() if model.get(name) is not None]
    if len(given) > 1:
        notes.append(("layer-split", "model.virtual_pipeline_model_parallel_size", (
            f"{' and '.join(given)} are given together: Megatron-LM asserts 'No more than one of the following "
            "arguments can be set at the same time'")))
        return notes
    pp = model.get("pipeline_model_parallel_size", 1)
    numbers = [pp] + [model.get(k) for k in ("num_layers", "num_layers_per_virtual_pipeline_stage",
                                              "num_virtual_stages_per_pipeline_rank") if model.get(k) is not None]
    if any(n < 1 for n in numbers):
        return notes  # out of range: the config model refuses it with the field's name
    vpp, derived = _vpp(model, extra, pp, notes)
    if not derived:
        notes.append(("derived-value", "model.num_layers_per_virtual_pipeline_stage", (
            "--num-layers-per-virtual-pipeline-stage without --num-layers: the VPP size it gives could not be "
            "derived and is taken as set; give --num-layers to have it (and the layer split) checked")))
        return notes
    model.pop("num_layers_per_virtual_pipeline_stage", None)  # read: the VPP size stands for it now
    model["virtual_pipeline_model_parallel_size"] = vpp
    if vpp is not None:
        p2p = not extra.get("no_overlap_p2p_communication")
        if pp <= (1 if p2p else 2):
            notes.append(("layer-split", "model.pipeline_model_parallel_size", (
                f"the interleaved schedule (VPP {vpp}) needs --pipeline-model-parallel-size > {1 if p2p else 2}"
                f"{'' if p2p else ' with --no-overlap-p2p-communication'}, got {pp}: Megatron-LM asserts 'When "
                "interleaved schedule is used, pipeline-model-parallel size should be greater than "
                f"{1 if p2p else 2}'")))
    return notes
