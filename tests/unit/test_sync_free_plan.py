"""ep/sync_free.py on one process: the device index plan against a plain loop, and the memory table of the docs."""

from __future__ import annotations

import re

import pytest
import torch

from moe_overlap.ep import sync_free as sf
from moe_overlap.ep.dispatcher import plan_permute
from moe_overlap.paths import docs_dir


@pytest.mark.parametrize("world,local,tokens,topk,cap", [(2, 3, 7, 2, None), (4, 2, 9, 3, None), (3, 2, 8, 2, 4)])
def test_plan_moves_each_row_where_a_loop_puts_it(world, local, tokens, topk, cap):
    """One rank's send side, and a receive side from made-up counts, against a row-by-row loop."""
    gen = torch.Generator().manual_seed(world * 100 + tokens)
    experts_TK = torch.stack([torch.randperm(world * local, generator=gen)[:topk] for _ in range(tokens)])
    pplan = plan_permute(experts_TK, world * local)
    kept_RL = sf.kept_counts(pplan, world, cap)
    send = sf.send_side(pplan, kept_RL, cap)
    p = send.rows_per_peer
    rows = torch.arange(tokens * topk, dtype=torch.float32).unsqueeze(1) + 1  # row n holds n + 1
    blocks = sf.pad_send(rows, send)
    want = torch.zeros(world * p, 1)
    per_peer = [0] * world
    for n, e in enumerate(experts_TK.reshape(-1)[pplan.perm_N].tolist()):
        r = e // local
        if per_peer[r] < p:
            want[r * p + per_peer[r]] = n + 1
        per_peer[r] += 1
    assert torch.equal(blocks, want)
    back = sf.unpad_send(blocks, send)  # dropped rows come back as zero
    kept_rows = back.squeeze(1) != 0
    assert cap is not None or bool(kept_rows.all())
    assert torch.equal(back[kept_rows], rows[kept_rows]) and int(kept_rows.sum()) == sum(min(c, p) for c in per_peer)
    # receive side: source s sent recv_RL[s, j] rows for local expert j, in block s, by expert
    recv_RL = torch.randint(0, p // local + 1, (world, local), generator=gen)
    plan = sf.build_plan(pplan, send, recv_RL)
    tags = torch.zeros(world * p, 1)
    order = []  # (expert, source, i) of each received row, in the compact order the GEMMs want
    for s in range(world):
        at = 0
        for j in range(local):
            for i in range(int(recv_RL[s, j])):
                tags[s * p + at] = 1000 * (j + 1) + 10 * s + i
                at += 1
    for j in range(local):
        for s in range(world):
            order += [1000 * (j + 1) + 10 * s + i for i in range(int(recv_RL[s, j]))]
    compact = sf.compact(tags, plan)
    assert compact[:len(order)].squeeze(1).tolist() == order
    assert torch.equal(plan.tokens_per_local_expert, recv_RL.sum(0))
    assert torch.equal(sf.uncompact(compact, plan), tags)  # and back, padding zero


def test_memory_table_in_the_docs_is_buffer_bytes():
    text = (docs_dir() / "ep-implementation.md").read_text()
    rows = re.findall(r"^\| (Qwen3-30B-A3B|DeepSeek-V3)[^|]*\| (\d) \| (\d+) \(worst\) \| (\d+) MiB \| (\d+) MiB \|$", text, re.M)
    assert len(rows) == 4
    dims = {"Qwen3-30B-A3B": (2048, 768), "DeepSeek-V3": (7168, 2048)}
    for name, ep, p, wire, kept in rows:
        b = sf.buffer_bytes(4096, 8, *dims[name], int(ep))
        assert (b["rows"] // int(ep), b["wire_BD"] >> 20, b["kept_forward"] >> 20) == (int(p), int(wire), int(kept))
    cap = sf.buffer_bytes(4096, 8, 2048, 768, 8, capacity=5120)
    assert (cap["wire_BD"] >> 20, cap["kept_forward"] >> 20, cap["dropless_kept"] >> 20) == (160, 280, 224)
