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


@pytest.mark.bench
def test_bench_skinny_heads():
    from benchmarks.skinny_heads import main

    assert main(["--shapes", "32000x4096,2048x2048", "--norm-shapes", "50257x768", "--m", "1,8", "--no-decode",
                 "--no-write"]) == 0
