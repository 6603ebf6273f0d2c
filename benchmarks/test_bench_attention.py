import pytest


@pytest.mark.bench
def test_bench_attention():
    from benchmarks.attention import main

    rows, _ = main([])
    assert rows



@pytest.mark.bench
def test_bench_attention_fp8():
    from benchmarks.attention import main

    rows, summary = main(["--fp8", "--no-write", "--seqlens", "4096", "--gqa", "8"])
    assert any(r.provider == "cute_fp8" for r in rows) and "geomean_speedup_fp8_vs_bf16" in summary
    assert any(r.provider == "cute_fp8_quant" for r in rows) and "geomean_speedup_fp8_quant_vs_bf16" in summary
