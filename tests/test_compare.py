"""benchmarks/compare.py's report (pure data: no GPU)."""

import pytest


def test_compare_report_is_per_group_geomean():
    """benchmarks/compare.py report: before/after speed per case and its geomean per group."""
    from benchmarks.compare import report

    before = {"gpu": "G", "res": {"gemm a": {"cute": 2.0, "vendor": 1.0, "err": 0}, "gemm b": {"cute": 1.0, "vendor": 1.0, "err": 0}}}
    after = {"gpu": "G", "res": {"gemm a": {"cute": 1.0, "vendor": 1.0, "err": 0}, "gemm b": {"cute": 2.0, "vendor": 1.0, "err": 0}}}
    payload, md = report(before, after, "x", "", "2026-01-01")
    assert payload["summary"]["geomean_after_vs_before[gemm]"] == 1.0 and payload["summary"]["min_after_vs_before[gemm]"] == 0.5
    assert "| gemm a | 2.0000 | 1.0000 | 2.000x |" in md
    with pytest.raises(ValueError, match="one machine"):
        report(before, {**after, "gpu": "H"}, "x", "", "2026-01-01")
