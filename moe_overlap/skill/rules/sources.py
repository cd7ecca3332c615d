"""Where each upstream check lives: file and line in every megatron-core release the rules know, and in
Megatron-Bridge 0.6.2. A rule's `source` is built from these, so a finding names the line to read.

Read from the released wheels on the registry (megatron-core 0.16.1, 0.17.1, 0.18.2, 0.19.2;
megatron-bridge 0.6.2); the oracle test re-reads each line from the unpacked wheels and fails when a
message is no longer where this table says (tests/oracle/test_sources.py).
"""

from __future__ import annotations

RELEASES = ("0.16.1", "0.17.1", "0.18.2", "0.19.2")
TC = "megatron/core/transformer/transformer_config.py"

# check id -> (file inside the wheel, a substring of the message on that line, {release: line})
CORE: dict[str, tuple[str, str, dict[str, int]]] = {
    "torch": (TC, "A2A Overlap encounters hang issue", {"0.16.1": 1856, "0.17.1": 2098, "0.18.2": 2403, "0.19.2": 2673}),
    "vpp": (TC, "If enabling EP A2A overlap", {"0.16.1": 1859, "0.17.1": 2101, "0.18.2": 2406, "0.19.2": 2676}),
    "ep": (TC, "only supported with expert model parallelism",
           {"0.16.1": 1865, "0.17.1": 2107, "0.18.2": 2412, "0.19.2": 2682}),
    "dispatcher": (TC, "supported with alltoall/flex token dispatcher",
                   {"0.16.1": 1869, "0.17.1": 2111, "0.18.2": 2416, "0.19.2": 2686}),
    "full-recompute": (TC, "disable full recomputation when enabling",
                       {"0.16.1": 1873, "0.17.1": 2115, "0.18.2": 2420, "0.19.2": 2690}),
    "recompute-method": (TC, "disable recomputation method when enabling",
                         {"0.16.1": 1876, "0.17.1": 2118, "0.18.2": 2423, "0.19.2": 2693}),
    "recompute-layers": (TC, "recompute_num_layers must be None when enabling",
                         {"0.16.1": 1879, "0.17.1": 2121, "0.18.2": 2426, "0.19.2": 2696}),
    "moe-recompute": (TC, "disable moe in recompute_modules", {"0.17.1": 2124, "0.18.2": 2429, "0.19.2": 2699}),
    "precision": (TC, "only supported with bf16 or fp16 model",
                  {"0.16.1": 1884, "0.17.1": 2129, "0.18.2": 2434, "0.19.2": 2704}),
    "shared-overlap": (TC, "disable moe_shared_expert_overlap when enabling",
                       {"0.16.1": 1888, "0.17.1": 2133, "0.18.2": 2438, "0.19.2": 2708}),
    "mtp-1": (TC, "MTP layernum only supports 1", {"0.16.1": 1891, "0.17.1": 2136, "0.18.2": 2441}),
    "mtp-0-1": (TC, "MTP supports at most one layer", {"0.19.2": 2713}),
    "mtp-pp": (TC, "when enabling overlap_moe_expert_parallel_comm with MTP layer", {"0.16.1": 1895, "0.17.1": 2140}),
    "graph-scope": (TC, "CUDA graph scope on moe and mlp", {"0.16.1": 1904, "0.17.1": 2149, "0.18.2": 2449,
                                                            "0.19.2": 2744}),
    "ncclep-offload": (TC, "ncclep does not support offloading", {"0.19.2": 2733}),
    "wgrad-overlap": (TC, "must be enabled when enabling delay_wgrad_compute",
                      {"0.16.1": 1912, "0.17.1": 2157, "0.18.2": 2457, "0.19.2": 2752}),
    "wgrad-legacy-gemm": (TC, "legacy groupedgemm", {"0.16.1": 1915}),
    "wgrad-graph-te": (TC, "TE version >= 2.10.0 is required for delay_wgrad",
                       {"0.16.1": 1918, "0.17.1": 2160, "0.18.2": 2460, "0.19.2": 2755}),
    "dispatch-wgrad-overlap": (TC, "must be disabled when enabling", {"0.18.2": 2466, "0.19.2": 2761}),
    "dispatch-wgrad-te": (TC, "TE version >= 2.3.0 is required for overlap_dispatch", {"0.18.2": 2471, "0.19.2": 2766}),
    "dispatch-wgrad-delay": (TC, "are mutually exclusive; use only one", {"0.18.2": 2474, "0.19.2": 2769}),
    "early-release": (TC, "'ep_overlap_early_attn_memory_release'",
                      {"0.16.1": 1925, "0.17.1": 2167, "0.18.2": 2480, "0.19.2": 2775}),
    "deepep-flex": (TC, "DeepEP backend is only supported with flex",
                    {"0.16.1": 1065, "0.17.1": 1245, "0.18.2": 1442, "0.19.2": 1591}),
    "deepep-hybridep": (TC, "Only one backend is supported", {"0.16.1": 1067, "0.17.1": 1247, "0.18.2": 1444,
                                                              "0.19.2": 1593}),
    "ncclep-flex": (TC, "moe_flex_dispatcher_backend='ncclep' requires", {"0.19.2": 1612}),
    # Outside TransformerConfig: at model build, at the first step, or in Megatron-LM's argument checks.
    "graph-whole-layer": ("megatron/core/transformer/transformer_layer.py",
                          "disabled when CUDA graph captures the whole MLP/MoE part",
                          {"0.16.1": 1044, "0.17.1": 1108, "0.18.2": 1169, "0.19.2": 1264}),
    "fsdp-double-buffer": ("megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
                           "1F1B overlap with FSDP does not support double buffer", {"0.18.2": 162, "0.19.2": 170}),
    "fsdp-graphs": ("megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
                    "1F1B overlap with FSDP does not support per-layer CUDA graphs", {"0.18.2": 166, "0.19.2": 174}),
    "mlm-grad-reduce-te": ("megatron/training/arguments.py", "overlap_grad_reduce is only supported with TE >= 2.8.0",
                           {"0.17.1": 1520, "0.18.2": 1695, "0.19.2": 1827}),
    "mlm-graph-te": ("megatron/training/arguments.py", "CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0",
                     {"0.17.1": 1530, "0.18.2": 1705, "0.19.2": 1837}),
    "mlm-te-impl": ("megatron/training/arguments.py", "Delaying wgrad compute is only supported with transformer_engine",
                    {"0.17.1": 1517, "0.18.2": 1692, "0.19.2": 1824}),
    "mlm-no-fusion-te": ("megatron/training/arguments.py",
                         "disabling gradient_accumulation_fusion is only supported with TE >= 2.7.0",
                         {"0.17.1": 1543, "0.18.2": 1718, "0.19.2": 1850}),
    "te-layer-2-3": ("megatron/core/extensions/transformer_engine.py",
                     "Only TE with version >=2.3.0 supports delay_wgrad_compute",
                     {"0.16.1": 529, "0.17.1": 726, "0.18.2": 798, "0.19.2": 920}),
    "flex-backend-invalid": ("megatron/core/transformer/moe/token_dispatcher.py", "Invalid backend: ",
                             {"0.16.1": 1366, "0.17.1": 1384, "0.18.2": 1441, "0.19.2": 1799}),
    "experts-divisible": ("megatron/core/transformer/moe/moe_layer.py", "num_moe_experts % ep_size == 0",
                          {"0.16.1": 101, "0.17.1": 169, "0.18.2": 185, "0.19.2": 185}),
    "schedule-plan": ("megatron/core/pipeline_parallel/combined_1f1b.py", "return_schedule_plan=True",
                      {"0.16.1": 343, "0.17.1": 348, "0.18.2": 380, "0.19.2": 385}),
}

BRIDGE_VERSION = "0.6.2"
# The Core release line a Bridge config runs on. The 0.6.2 wheel's METADATA requires megatron-core[dev,mlm] with no
# version; the pin is the 3rdparty/Megatron-LM submodule of Megatron-Bridge's r0.6.0 release branch, commit
# cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54, which is in Megatron-LM's core_v0.19.0 tag.
BRIDGE_CORE = "0.19"
BRIDGE_CORE_PIN = (f"a Megatron-Bridge config; Bridge {BRIDGE_VERSION} runs on megatron-core {BRIDGE_CORE}.x (its "
                   "3rdparty/Megatron-LM submodule, commit cd4afff, is in Megatron-LM's core_v0.19.0 tag)")
BRIDGE_CO = "megatron/bridge/training/comm_overlap.py"
BRIDGE_FLEX = "megatron/bridge/training/flex_dispatcher_backend.py"
# check id -> (file in the megatron-bridge 0.6.2 wheel, first line, last line)
BRIDGE: dict[str, tuple[str, int, int]] = {
    "ep": (BRIDGE_CO, 479, 481), "experts": (BRIDGE_CO, 482, 485), "dispatcher": (BRIDGE_CO, 486, 489),
    "precision": (BRIDGE_CO, 490, 492), "torch": (BRIDGE_CO, 493, 493), "vpp": (BRIDGE_CO, 494, 498),
    "full-recompute": (BRIDGE_CO, 499, 501), "recompute-method": (BRIDGE_CO, 502, 504),
    "recompute-layers": (BRIDGE_CO, 505, 507), "moe-recompute": (BRIDGE_CO, 508, 512),
    "shared-overlap": (BRIDGE_CO, 513, 515), "mtp": (BRIDGE_CO, 516, 518),
    "wgrad-grad-reduce-te": (BRIDGE_CO, 521, 525), "wgrad-fusion-te": (BRIDGE_CO, 526, 530),
    "wgrad-overlap": (BRIDGE_CO, 532, 535), "wgrad-graph": (BRIDGE_CO, 537, 557),
    "flex-apply": (BRIDGE_FLEX, 33, 99), "flex-validate": (BRIDGE_FLEX, 102, 126),
}


def core(check: str) -> str:
    """'megatron-core megatron/core/...py:1856 (0.16.1), :2098 (0.17.1), ...' for one check."""
    path, _, lines = CORE[check]
    where = ", ".join(f"{'' if i else path}:{line} ({release})" for i, (release, line) in enumerate(lines.items()))
    return f"megatron-core {where}"


def bridge(check: str) -> str:
    path, first, last = BRIDGE[check]
    span = f"{first}" if first == last else f"{first}-{last}"
    return f"megatron-bridge {BRIDGE_VERSION} src/{path}:{span}"


def both(core_check: str, bridge_check: str) -> str:
    return f"{core(core_check)}; {bridge(bridge_check)}"
