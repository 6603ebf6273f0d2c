import pytest


@pytest.mark.bench
def test_bench_fp8():
    from benchmarks.quantized import main

    assert main(["--kind", "fp8"])["fp8"][0]


@pytest.mark.bench
def test_bench_int8():
    from benchmarks.quantized import main

    assert main(["--kind", "int8"])["int8"][0]
