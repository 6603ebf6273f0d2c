import pytest


@pytest.mark.bench
def test_bench_gemm_bf16():
    from benchmarks.gemm import main

    rows, summary = main([])
    assert rows


@pytest.mark.bench
def test_bench_gemm_decode():
    from benchmarks.gemm import main

    rows, summary = main(["--decode"])
    assert rows
