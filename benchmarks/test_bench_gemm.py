import pytest


@pytest.mark.bench
def test_bench_gemm_bf16():
    from benchmarks.gemm import main

    rows, summary = main([])
    assert rows
