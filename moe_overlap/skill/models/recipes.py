"""Megatron-Bridge 0.6.2's recipes for the models in shapes.py: parallel layout, batch, dispatcher, EP overlap.

Each entry is one recipe function of the megatron-bridge 0.6.2 wheel (``file`` under ``megatron/bridge/``), BF16
variants only. ``tests/unit/test_generate_recipes.py`` re-reads every value from the unpacked wheel
(tests/oracle/bridge_recipes.py walks the recipe's syntax tree), so a value here that drifts from the file fails.
``dispatcher``/``backend`` are what the recipe ends with on its GPU (``apply_flex_dispatcher_backend`` keeps
flex where the GPU supports the backend). ``overlap``/``wgrad`` are its EP-overlap settings (False: not set).
"""

from __future__ import annotations

from dataclasses import dataclass

PERF_QWEN = "perf_recipes/qwen/{}/qwen3_moe.py"
PERF_DSV3 = "perf_recipes/deepseek/{}/deepseek_v3.py"


@dataclass(frozen=True)
class Recipe:
    model: str
    gpu: str  # the GPU family the recipe is for: H100, B200, GB200
    gpus: int
    tp: int
    pp: int
    vpp: int | None
    ep: int
    mbs: int
    gbs: int
    dispatcher: str
    backend: str | None
    file: str
    function: str
    overlap: bool = False
    wgrad: bool = False
    layout: str | None = None  # pipeline_model_parallel_layout given explicitly; "default-layout-map": Bridge's
    recompute: str | None = None
    etp: int = 1
    cuda_device_max_connections: int | None = None

    @property
    def where(self) -> str:
        return f"megatron-bridge 0.6.2 src/megatron/bridge/{self.file} {self.function}"


RECIPES: tuple[Recipe, ...] = (
    Recipe("qwen3-30b-a3b", "H100", 16, 1, 1, None, 16, 1, 1024, "flex", "hybridep", PERF_QWEN.format("h100"),
           "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", overlap=True, cuda_device_max_connections=32),
    Recipe("qwen3-30b-a3b", "H100", 64, 1, 1, None, 16, 1, 4096, "flex", "hybridep", PERF_QWEN.format("h100"),
           "qwen3_30b_a3b_pretrain_64gpu_h100_bf16_config", overlap=True, cuda_device_max_connections=32),
    Recipe("qwen3-30b-a3b", "B200", 8, 1, 1, None, 8, 4, 512, "flex", "hybridep", PERF_QWEN.format("b200"),
           "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config", cuda_device_max_connections=32),
    Recipe("qwen3-30b-a3b", "GB200", 8, 1, 1, None, 8, 4, 512, "flex", "hybridep", PERF_QWEN.format("gb200"),
           "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config", cuda_device_max_connections=32),
    Recipe("qwen3-235b-a22b", "H100", 256, 2, 8, 4, 32, 1, 8192, "alltoall", None, PERF_QWEN.format("h100"),
           "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", overlap=True, wgrad=True,
           cuda_device_max_connections=8),
    Recipe("qwen3-235b-a22b", "B200", 64, 1, 8, 4, 8, 1, 2048, "alltoall", None, PERF_QWEN.format("b200"),
           "qwen3_235b_a22b_pretrain_64gpu_b200_bf16_config", cuda_device_max_connections=32),
    Recipe("qwen3-235b-a22b", "GB200", 64, 1, 8, None, 8, 1, 2048, "flex", "hybridep", PERF_QWEN.format("gb200"),
           "qwen3_235b_a22b_pretrain_64gpu_gb200_bf16_config", cuda_device_max_connections=32),
    Recipe("qwen3-next-80b-a3b", "H100", 128, 1, 1, None, 128, 1, 1024, "alltoall", None, PERF_QWEN.format("h100"),
           "qwen3_next_80b_a3b_pretrain_128gpu_h100_bf16_config", cuda_device_max_connections=32),
    Recipe("deepseek-v3", "H100", 1024, 2, 8, 4, 64, 1, 16384, "flex", "hybridep", PERF_DSV3.format("h100"),
           "deepseek_v3_pretrain_1024gpu_h100_bf16_config", layout="Et|(tt|)*30mL", recompute="selective",
           cuda_device_max_connections=1),
    Recipe("deepseek-v3", "H100", 256, 2, 8, None, 32, 1, 4096, "flex", "hybridep",
           "recipes/deepseek/h100/deepseek_v3.py", "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config",
           layout="default-layout-map", recompute="full"),
    Recipe("deepseek-v3", "B200", 256, 1, 8, None, 8, 1, 4096, "flex", "hybridep", PERF_DSV3.format("b200"),
           "deepseek_v3_pretrain_256gpu_b200_bf16_config", layout="default-layout-map", recompute="selective",
           cuda_device_max_connections=32),
    Recipe("deepseek-v3", "GB200", 256, 1, 4, 4, 64, 1, 4096, "flex", "hybridep", PERF_DSV3.format("gb200"),
           "deepseek_v3_pretrain_256gpu_gb200_bf16_config", layout="default-layout-map", recompute="selective",
           cuda_device_max_connections=32),
)


def gpu_family(name: str | None, cc: str | None) -> str | None:
    """The recipe GPU family of a GPU: Hopper -> H100, GB200/GB300 -> GB200, other Blackwell -> B200."""
    if name and name.upper().startswith("GB"):
        return "GB200"
    if cc and cc.startswith("9."):
        return "H100"
    if cc and cc.startswith("10."):
        return "B200"
    return None


def recipes_for(model: str, family: str | None = None) -> list[Recipe]:
    return [r for r in RECIPES if r.model == model and (family is None or r.gpu == family)]


def nearest(model: str, family: str | None, gpus: int | None, pp: int | None = None) -> Recipe | None:
    """The recipe closest to this request: the same GPU family (H100 when none is given, the base recipes' GPU),
    the same PP when given, then the closest GPU count."""
    pool = recipes_for(model, family or "H100")
    if pp is not None and any(r.pp == pp for r in pool):
        pool = [r for r in pool if r.pp == pp]
    if not pool:
        return None
    return min(pool, key=lambda r: (abs(r.gpus - gpus) if gpus else 0, r.gpus))


def with_virtual_pipeline(model: str, pp: int, family: str | None) -> Recipe | None:
    """A recipe of this model at this PP that sets VPP (the same family first): where a layout comes from."""
    pool = [r for r in recipes_for(model) if r.pp == pp and r.vpp]
    pool.sort(key=lambda r: (r.gpu != (family or "H100"), r.layout in (None, "default-layout-map")))
    return pool[0] if pool else None
