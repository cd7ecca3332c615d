"""Round trip: every config `generate` writes validates clean under `validate_config` in the same environment,
in every format the validator reads (YAML file, JSON file, dotted overrides, Megatron-LM argv), and all four
formats mean the same config (identical effective values)."""

import itertools

import pytest

from moe_overlap.skill.config import megatron_lm
from moe_overlap.skill.config.model import effective_values, parse_config
from moe_overlap.skill.generate.api import generate_config
from moe_overlap.skill.generate.model import RECOMMENDED_ENV, GenerateRequest
from moe_overlap.skill.generate.render import megatron_argv, override_items, render
from moe_overlap.skill.rules.validate import validate_config

# Warnings a stage is expected to carry by design (the plan's order is the point of the warning).
EXPECTED_WARNINGS = {"baseline": set(), "overlap": set(), "overlap+wgrad": {"wgrad-not-in-first-rollout"},
                     "flex": {"wgrad-not-in-first-rollout"}}
# Megatron-LM derives VPP from --num-layers-per-virtual-pipeline-stage; the other formats give VPP itself.
VPP_KEYS = {"virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage"}


def _grid() -> list[GenerateRequest]:
    layouts = [(2, 8, None), (4, 64, None), (8, 64, 2), (8, 128, 8), (16, 128, 8), (4, 16, 4)]
    stages = ["baseline", "overlap", "overlap+wgrad", "flex"]
    dispatchers = ["alltoall", "flex"]
    gpus = ["H100", "A100", "GB200", "B200", "9.0"]
    precisions = ["bf16", "fp16"]
    pipelines = [(1, None), (2, 8), (4, 16)]
    extras = [dict(), dict(micro_batches=4, tp=2), dict(recompute="selective", micro_batches=2)]
    cores = ["0.16.1", "0.19.0"]
    full = list(itertools.product(layouts, stages, dispatchers, gpus, precisions, pipelines, extras, cores))
    picked = full[::29]  # a fixed, spread-out sample: every factor level appears many times
    out = []
    for (ep, experts, topk), stage, dispatcher, gpu, precision, (pp, layers), extra, core in picked:
        out.append(GenerateRequest(ep=ep, experts=experts, topk=topk, stage=stage, dispatcher=dispatcher, gpu=gpu,
                                   precision=precision, pp=pp, num_layers=layers, torch_version="2.6.0",
                                   te_version="2.7.0", megatron_core_version=core, **extra))
    for preset, gpus_n in (("qwen3-30b-a3b", 16), ("deepseek-v3", 64), ("mixtral-8x7b", 8)):
        out.append(GenerateRequest(preset=preset, gpus=gpus_n, plan=True, gpu="H100", torch_version="2.7.1",
                                   te_version="2.9.0", micro_batches=8))
    # the model presets at their Bridge recipes' scales (issue 30), with and without a GPU
    for kw in (dict(model="qwen3-30b-a3b", gpus=16), dict(model="deepseek-v3", gpus=256, pp=8),
               dict(model="qwen3-235b-a22b", gpus=256, pp=8), dict(model="qwen3-next-80b-a3b", gpus=128)):
        for gpu in (None, "H100"):
            out.append(GenerateRequest(**kw, gpu=gpu, plan=True, torch_version="2.7.1", te_version="2.9.0"))
    return out


GRID = _grid()


def test_grid_is_large_and_varied():
    assert len(GRID) >= 200
    assert {r.stage for r in GRID} == {"baseline", "overlap", "overlap+wgrad", "flex"}
    assert {r.pp for r in GRID} == {1, 2, 4, 8} and {r.dispatcher for r in GRID} == {None, "alltoall", "flex"}


def _check(result, stage: str, label: str, gpu_known: bool = True):
    assert result.valid, (label, [f.message for f in result.findings if f.severity == "error"])
    warnings = {f.rule for f in result.findings if f.severity == "warning"}
    # with no GPU given, the flex backend's GPU support cannot be checked: a warning by design
    unchecked = set() if gpu_known or stage != "flex" else {"flex-backend-gpu-support"}
    assert warnings <= EXPECTED_WARNINGS[stage] | unchecked, (label, warnings)


@pytest.mark.parametrize("chunk", range(4))
def test_every_generated_config_validates_clean_in_every_format(tmp_path, chunk):
    checked = 0
    for i, req in enumerate(GRID[chunk::4]):
        result = generate_config(req)
        assert result.ok, (req, result.refusal)
        env = dict(torch_version=req.torch_version, te_version=req.te_version, gpu=req.gpu,
                   megatron_core_version=req.megatron_core_version, env=RECOMMENDED_ENV, detect=False)
        for stage in result.stages:
            config = stage.config
            yaml_file = tmp_path / f"{i}-{stage.stage}.yaml"
            yaml_file.write_text(render(config, "yaml"))
            json_file = tmp_path / f"{i}-{stage.stage}.json"
            json_file.write_text(render(config, "json"))
            overrides = render(config, "overrides").split()
            argv = render(config, "megatron-args")
            export, *flags = argv.splitlines()  # the launcher's environment first, then one flag per line
            assert export == "export CUDA_DEVICE_MAX_CONNECTIONS=32"
            assert overrides == override_items(config) and " ".join(flags).split() == megatron_argv(config)
            views = {}
            for label, kwargs in (("yaml", dict(source=yaml_file)), ("json", dict(source=json_file)),
                                  ("overrides", dict(overrides=overrides)), ("megatron-args", dict(argv=argv))):
                _check(validate_config(**kwargs, **env), stage.stage, f"{req} {stage.stage} {label}", req.gpu is not None)
                parsed = parse_config(kwargs.get("source"), kwargs.get("overrides", ()), argv=kwargs.get("argv"))
                views[label] = effective_values(parsed)[0]
            base = {k: v for k, v in views["yaml"].items() if k not in VPP_KEYS}
            for label, values in views.items():
                # Megatron-LM's own defaults (fusion on, TE layers) fill what a Bridge config leaves unset.
                skip = VPP_KEYS | (set(megatron_lm.DEFAULTS) if label == "megatron-args" else set())
                assert {k: v for k, v in values.items() if k not in skip} == {
                    k: v for k, v in base.items() if k not in skip}, (req, stage.stage, label)
            # the formats carry the stage's intent
            assert base["overlap_moe_expert_parallel_comm"] == (stage.stage != "baseline")
            assert base["delay_wgrad_compute"] == (stage.stage in ("overlap+wgrad", "flex"))
            flex = stage.stage == "flex" or result.stages[0].config["model"]["moe_token_dispatcher_type"] == "flex"
            assert (base["moe_token_dispatcher_type"] == "flex") == flex
            # the notes of this config: the overlap ones on overlap stages, the control's on the baseline
            ids = {n.id for n in stage.next}
            assert ("micro-batches" in ids) == (stage.stage != "baseline") != ("baseline-is-the-control" in ids)
            if req.pp > 1:
                # Megatron-LM derives the VPP size from the layer flags: the same as the config's
                assert views["megatron-args"]["virtual_pipeline_model_parallel_size"] == views["yaml"][
                    "virtual_pipeline_model_parallel_size"]
                assert views["yaml"]["virtual_pipeline_model_parallel_size"] >= 2
            checked += 1
    assert checked >= 50
