"""The hardware table: the right part for each Hopper device name, and reports read it."""

import pytest

from cute_kernels.runtime import hardware


@pytest.mark.parametrize("name,sms,part", [
    ("NVIDIA H100 80GB HBM3", 132, "H100 SXM"),
    ("NVIDIA H100 PCIe", 114, "H100 PCIe"),
    ("NVIDIA H100 NVL", 132, "H100 NVL"),
    ("NVIDIA H200", 132, "H200"),
    ("NVIDIA GH200 480GB", 132, "GH200"),
])
def test_lookup(name, sms, part):
    assert hardware.lookup(name, sms).name == part


def test_peaks_by_kind():
    p = hardware.PARTS["H200"]
    assert p.peak_tflops("bf16") == 989.4 and p.peak_tflops("int8") == 1978.9 and p.hbm_tbps == 4.8
    with pytest.raises(ValueError, match="no peak"):
        p.peak_tflops("tf32")


def test_benchmark_peaks_follow_the_part(monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(hardware, "current", lambda device_index=0: hardware.PARTS["H100 PCIe"])
    assert common.PEAK_TFLOPS["bf16"] == 756.0 and common.peak_tbps() == 2.0


def test_results_json_one_row_a_line():
    """Results files hold one row a line and load back to the same payload."""
    import json

    from benchmarks.common import results_json

    payload = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27",
               "rows": [{"case": "a", "provider": "cute", "ms": 0.1}, {"case": "a", "provider": "cublas", "ms": 0.2}],
               "summary": {"geomean": 2.0, "spec": {"a": [1, 2]}}}
    text = results_json(payload)
    assert json.loads(text) == payload
    assert text.splitlines()[4:6] == ['{"case": "a", "provider": "cute", "ms": 0.1},', '{"case": "a", "provider": "cublas", "ms": 0.2}']
    assert json.loads(results_json({"rows": {"ab": [1]}})) == {"rows": {"ab": [1]}}  # rows that are not a list
    rounded = json.loads(results_json({"rows": [{"ms": 0.21638399362564087, "t": [1 / 3]}], "summary": {"x": 1.0}}))
    assert rounded == {"rows": [{"ms": 0.216384, "t": [0.333333]}], "summary": {"x": 1.0}}  # 6 significant digits
