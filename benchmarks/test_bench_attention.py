import pytest


@pytest.mark.bench
def test_bench_attention():
    from benchmarks.attention import main

    rows, _ = main([])
    assert rows

