"""Shared checks for the compile tier: ptxas accepts a kernel's PTX for sm_90a without spills."""

import os
import re
import shutil
import subprocess

import pytest


def ptxas_report(ptx_path: str) -> str:
    """ptxas -v output for the PTX ("" without a ptxas). Skips the test where the local ptxas
    is older than the PTX the DSL emits (the GPU image's toolkit)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return ""
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", os.devnull], capture_output=True, text=True)
    if "Unsupported .version" in r.stderr:
        pytest.skip(f"{ptxas} is older than the DSL's PTX")
    assert r.returncode == 0, r.stderr
    return r.stderr


def assert_ptxas_no_spills(ptx_path: str) -> None:
    """No spill stores or loads in any kernel of the PTX."""
    report = ptxas_report(ptx_path)
    assert all(s == ("0", "0") for s in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report))
