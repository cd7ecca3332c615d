"""The chunked schedule's single weight-gradient GEMM: chunk rows regrouped expert-major, exactly."""

import torch

from moe_overlap.ep.experts import experts_wgrad
from moe_overlap.ep.schedule import merge_chunk_wgrad_inputs


def _chunk(counts, d, f, chunk):
    """Wgrad inputs of one chunk whose rows carry (chunk, expert, row) so a misplaced row shows."""
    rows = sum(counts)
    mark = torch.tensor([[chunk, j, r] for j, c in enumerate(counts) for r in range(c)], dtype=torch.float32)
    x = torch.cat([mark, torch.randn(rows, d - 3)], 1)
    return (x, torch.randn(rows, f), torch.randn(rows, 2 * f), torch.randn(rows, d), None)


def _expected(inputs, counts_CL):
    starts = [[sum(c[:j]) for j in range(len(c))] for c in counts_CL]
    out = []
    for i in range(4):
        out.append(torch.cat([inputs[c][i][starts[c][j]:starts[c][j] + counts_CL[c][j]]
                              for j in range(len(counts_CL[0])) for c in range(len(counts_CL))]))
    return out


def test_merge_puts_rows_in_expert_major_order_host_and_device_counts():
    torch.manual_seed(0)
    counts_CL = [(2, 0, 3, 1), (0, 4, 1, 0), (1, 1, 0, 2)]  # empty experts in some chunks
    inputs = [_chunk(c, 8, 4, i) for i, c in enumerate(counts_CL)]
    want = _expected(inputs, counts_CL)
    for counts in (counts_CL, [torch.tensor(c) for c in counts_CL]):
        merged, total = merge_chunk_wgrad_inputs(inputs, counts)
        for got, exp in zip(merged[:4], want, strict=True):
            assert torch.equal(got, exp)
        assert [int(v) for v in total] == [3, 5, 4, 3]
        assert merged[4] is None


def test_one_wgrad_equals_the_sum_of_per_chunk_wgrads():
    torch.manual_seed(1)
    counts_CL = [(3, 1, 2), (2, 2, 0)]
    inputs = [_chunk(c, 6, 4, i) for i, c in enumerate(counts_CL)]
    w1, w2 = torch.randn(3, 6, 8), torch.randn(3, 4, 6)
    merged, total = merge_chunk_wgrad_inputs(inputs, counts_CL)
    dw1, dw2 = experts_wgrad(merged, w1, w2, total)
    parts = [experts_wgrad(inp, w1, w2, c) for inp, c in zip(inputs, counts_CL, strict=True)]
    torch.testing.assert_close(dw1, sum(p[0] for p in parts), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw2, sum(p[1] for p in parts), rtol=1e-5, atol=1e-5)


def test_single_chunk_is_passed_through():
    inputs = [_chunk((1, 2), 4, 2, 0)]
    merged, counts = merge_chunk_wgrad_inputs(inputs, [(1, 2)])
    assert merged is inputs[0] and counts == (1, 2)


def test_block_transpose_index_matches_a_python_regrouping():
    from moe_overlap.ep.counts import block_transpose_index

    counts = [[2, 0, 1], [3, 1, 0]]  # blocks (a, b) laid out a-major
    rows, start = {}, 0
    for a, row in enumerate(counts):
        for b, n in enumerate(row):
            rows[a, b] = list(range(start, start + n))
            start += n
    want = [i for b in range(3) for a in range(2) for i in rows[a, b]]
    got = block_transpose_index(torch.tensor(counts)).tolist()
    assert got == want
    # and back: the b-major layout regrouped a-major is the inverse permutation
    back = block_transpose_index(torch.tensor(counts).t()).tolist()
    assert [got[i] for i in back] == list(range(start))
