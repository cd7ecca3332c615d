"""ep/graphed.py refuses what a CUDA graph cannot hold, naming why (torch-only, no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from moe_overlap.ep.graphed import check_graphable, graph_layer
from moe_overlap.ep.layer import MoELayer


def test_cpu_input_is_refused_with_the_fix():
    layer = MoELayer(16, 8, 4, 2)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        graph_layer(layer, torch.randn(8, 16))


def test_expert_parallel_layer_is_refused_naming_the_host_sync():
    layer = MoELayer(16, 8, 4, 2)
    layer.ep_size = 2  # as built over a 2-rank group
    with pytest.raises(ValueError, match=r"expert-parallel over 2 ranks.*token counts"):
        check_graphable(layer, torch.randn(8, 16))
