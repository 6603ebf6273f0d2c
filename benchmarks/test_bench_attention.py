import pytest


@pytest.mark.bench
def test_bench_attention():
    from benchmarks.attention import main

    rows, _ = main([])
    assert rows


def test_wide_suite_shapes_and_best_peer():
    """CPU: the widened suite's shapes (~16k tokens each, 32 query heads on 32 / 8 / 4 KV
    heads) and the best-peer ratio (the faster of cuDNN and FA4 that ran, over ours)."""
    from benchmarks.attention import best_peer_speedups, summarize, wide_shapes
    from benchmarks.common import Row

    shapes = wide_shapes()
    assert len(shapes) == 2 * 6 * 3 and (32, 32, 8, 512, 64) in shapes and (1, 32, 4, 16384, 128) in shapes
    assert all(B * S == 16384 and Hq == 32 and Hq % Hkv == 0 for B, Hq, Hkv, S, _ in shapes)
    with pytest.raises(ValueError, match="GQA ratio"):
        wide_shapes(gqa=(3,))
    rows = [Row("prefill-a", "cute", 1.0), Row("prefill-a", "cudnn", 0.9), Row("prefill-a", "fa4", 1.2),
            Row("prefill-a", "triton", 0.5), Row("prefill-b", "cute", 2.0), Row("prefill-b", "fa4", 2.2)]
    assert best_peer_speedups(rows) == pytest.approx({"prefill-a": 0.9, "prefill-b": 1.1})
    s = summarize(rows)
    assert s["min_speedup_vs_best_peer[prefill]"] == pytest.approx(0.9)
