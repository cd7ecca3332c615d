"""What matters next for a valid EP-overlap config: short notes, as data (id, applies_when, text, source).

A note is no constraint: it never changes `valid`. It says what the config will do to memory, how many
micro-batches it pairs, which environment it wants, what eval steps do, what delayed wgrad was measured to give,
and what to check next. `source` is ``rule:<id>`` (a card constraint), ``evidence:<id>`` (the card's evidence)
or ``doc:<path>`` (a file of this repository); tests/unit/test_result_notes.py checks every one resolves.
validate_config attaches the notes of a VALID overlap config; generate_config those of every stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from moe_overlap.skill.rules.base import Ctx


class ResultNote(BaseModel):
    id: str
    text: str
    source: str = Field(description="rule:<card constraint id>, evidence:<card evidence id> or doc:<repo path>")


@dataclass(frozen=True)
class NoteRule:
    id: str
    applies_when: Callable[[Ctx], bool]
    text: Callable[[Ctx, dict[str, Any]], str]
    source: str


def _micro_batches(c: Ctx, hint: dict[str, Any]) -> int | None:
    gbs, mbs = c["global_batch_size"], c["micro_batch_size"]
    dp = c["data_parallel_size"] or hint.get("dp")
    if gbs is None or mbs is None or not dp:
        return None
    return gbs // (mbs * dp)


def _memory(c: Ctx, hint: dict[str, Any]) -> str:
    vpp = c["virtual_pipeline_model_parallel_size"]
    extra = (" and, with the virtual pipeline, one extra warm-up forward before the 1F1B steps" if vpp else "")
    if c["ep_overlap_early_attn_memory_release"]:
        release = "ep_overlap_early_attn_memory_release is on: attention's backward runs before the forward MLP"
    else:
        release = ("if memory is short, set model.ep_overlap_early_attn_memory_release: true (the same field in "
                   "megatron-core 0.16.1-0.19.2; Megatron-LM --ep-overlap-early-attn-memory-release from 0.17): it "
                   "runs attention's backward earlier and frees its activations; full recompute is not an option")
    return (f"Memory: the forward of micro-batch k+1 runs beside the backward of k, so one more micro-batch's "
            f"activations are alive{extra}; {release}.")


def _micro_text(c: Ctx, hint: dict[str, Any]) -> str:
    m = _micro_batches(c, hint)
    if m is None:
        return ("Micro-batches: the overlap pairs micro-batch k+1's forward with k's backward, so it needs >= 2 per "
                "data-parallel rank: global_batch_size >= 2 x micro_batch_size x DP.")
    if m < 2:
        return f"Micro-batches: {m} per data-parallel rank leaves nothing to pair: use >= 2."
    if (c["pipeline_model_parallel_size"] or 1) > 1:
        return (f"Micro-batches: {m} per data-parallel rank; the pipeline's 1F1B steady state pairs a forward with "
                "a backward, warm-up and cool-down run alone, so more micro-batches hide more (>= 2 needed).")
    return (f"Micro-batches: {m} per data-parallel rank; the first forward and the last backward run alone, the "
            f"other {m - 1} steps pair a forward with a backward (>= 2 needed).")


def _connections(c: Ctx, hint: dict[str, Any]) -> str:
    value = c.env.cuda_device_max_connections or hint.get("cuda_device_max_connections")
    now = f"it is {value}" if value else "unset is CUDA's default of 8"
    text = (f"CUDA_DEVICE_MAX_CONNECTIONS: keep it > 1 in the launcher's environment ({now}); one published run "
            "measured +7.8% at 32 vs +3.7% at 1 (Megatron-LM PR 6311, DeepSeek-V3 proxy, 64 H100).")
    if (c["tensor_model_parallel_size"] or 1) > 1 or (c["context_parallel_size"] or 1) > 1:
        text += (" With TP or CP, Megatron-LM warns that their communication wants 1 and the overlap a larger "
                 "value: choose by which one you prioritise.")
    return text


def _eval(c: Ctx, hint: dict[str, Any]) -> str:
    return ("Eval and other forward-only steps run the ordinary schedule: Megatron-Core takes the overlapped "
            "(combined 1F1B) path only when not forward_only (pipeline_parallel/schedules.py, 0.16.1-0.19.2), so "
            "evaluation is not overlapped and needs no second micro-batch.")


def _wgrad(c: Ctx, hint: dict[str, Any]) -> str:
    measured = ("measured +0.4% on top of plain overlap at EP16 (Qwen3-30B-A3B, 16 H100: 31.31 -> 31.20 s per step) "
                "and 4.8% slower at EP8 (Qwen3-Next-80B-A3B: 4686 -> 4912 ms)")
    if c.wgrad:
        return f"Delayed wgrad is on: {measured}; keep it only where your own A/B against plain overlap gains."
    return f"Delayed wgrad (the next stage) {measured}: add it only after plain overlap matches the baseline."


def _verify(c: Ctx, hint: dict[str, Any]) -> str:
    return ("Next: `moe-overlap verify` (baseline vs overlap: no hang, same loss), then ~20 steps of your job against "
            "the baseline (`moe-overlap check-logs`), then an Nsight Systems profile: all-to-all kernels should run "
            "beside the expert GEMMs, not between them.")


def _baseline(c: Ctx, hint: dict[str, Any]) -> str:
    return ("This is the control (overlap off): record its loss curve and step time over ~20 steps; each overlap "
            "stage must follow this loss and beat, or at least match, this step time.")


def _overlap(c: Ctx) -> bool:
    return c.overlap


def _no_overlap(c: Ctx) -> bool:
    return not c.overlap


NOTES: tuple[NoteRule, ...] = (
    NoteRule("memory-extra-micro-batch", _overlap, _memory, "rule:early-attn-release-needs-overlap"),
    NoteRule("micro-batches", _overlap, _micro_text, "rule:single-micro-batch"),
    NoteRule("cuda-device-max-connections", _overlap, _connections, "evidence:megatron-lm-pr-6311"),
    NoteRule("eval-forward-only", _overlap, _eval, "evidence:core-schedules"),
    NoteRule("delayed-wgrad-measured", _overlap, _wgrad, "evidence:bridge-ep-overlap-skill"),
    NoteRule("verify-next", _overlap, _verify, "doc:docs/verify.md"),
    NoteRule("baseline-is-the-control", _no_overlap, _baseline, "doc:docs/generate.md"),
)


def notes_for(ctx: Ctx, **hint: Any) -> list[ResultNote]:
    """The notes that apply to this config. `hint` may give what the config does not say (dp, the env value)."""
    return [ResultNote(id=n.id, text=n.text(ctx, hint), source=n.source) for n in NOTES if n.applies_when(ctx)]
