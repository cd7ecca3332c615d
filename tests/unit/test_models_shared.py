"""skill/models is the one table of model shapes: the estimator's presets are the same shapes (until estimate reads
skill/models itself, this keeps the two from drifting), and every shape is self-consistent."""

from __future__ import annotations

import pytest

from moe_overlap.skill.estimate.models import MODELS as ESTIMATE
from moe_overlap.skill.models.layout import layout_layers, layout_stages, uneven_layout
from moe_overlap.skill.models.shapes import MODELS


def test_every_estimate_preset_is_a_shared_shape_with_the_same_numbers():
    assert set(ESTIMATE) <= set(MODELS)
    for name, e in ESTIMATE.items():
        s = MODELS[name]
        assert (e.hidden, e.moe_ffn, e.experts, e.topk, e.layers) == (
            s.hidden_size, s.moe_ffn_hidden_size, s.num_moe_experts, s.moe_router_topk, s.moe_layers), name
        assert (e.attn_weights, e.heads, e.qk_head_dim, e.v_head_dim) == (
            s.attention_weights(), s.num_attention_heads, s.qk_head_dim, s.v_head_dim), name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_are_consistent(name):
    s = MODELS[name]
    assert 1 <= s.moe_router_topk <= s.num_moe_experts and s.moe_layers >= 1
    if not s.layer_only:
        assert (s.mla is None) != (s.kv_channels is None)  # GQA or MLA, never both
        assert s.num_attention_heads % (s.num_query_groups or s.num_attention_heads) == 0
        freq = s.moe_layer_freq()
        assert freq is None or (len(freq) == s.num_layers and sum(freq) == s.moe_layers)


@pytest.mark.parametrize("layers,pp,vpp,mtp", [(61, 8, 4, 1), (61, 8, 2, 1), (61, 4, 4, 0), (10, 2, 2, 0),
                                               (7, 2, 2, 1), (94, 8, 3, 0)])
def test_uneven_layouts_hold_every_layer_once(layers, pp, vpp, mtp):
    stages = layout_stages(uneven_layout(layers, pp, vpp, mtp))
    assert len(stages) == pp * vpp and layout_layers(uneven_layout(layers, pp, vpp, mtp)) == layers
    assert stages[0].startswith("E") and stages[-1] == "m" * mtp + "L" and all("t" in s for s in stages[:-1])
    counts = [s.count("t") for s in stages[:-1]]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts)  # even, short stages first
    assert uneven_layout(3, 4, 2, 0) is None  # fewer layers than stages: no layout
