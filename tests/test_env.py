"""Runtime switches: every CUTE_KERNELS_* variable the code names is declared in runtime/env.py."""

import re
from pathlib import Path

from cute_kernels.runtime import env

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cute_kernels", "inference", "quant", "baselines", "benchmarks")


def test_every_switch_the_code_names_is_declared():
    named = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for name in re.findall(r"CUTE_KERNELS_[A-Z0-9_]+", path.read_text()):
                named.setdefault(name, path.relative_to(ROOT).as_posix())
    undeclared = {n: p for n, p in named.items() if n not in env.SWITCHES}
    assert not undeclared, f"undeclared runtime switches (add them to runtime/env.py): {undeclared}"
    unused = set(env.SWITCHES) - set(named) - {"CUTE_KERNELS_RESULTS_DIR"}
    assert not {n for n in unused if n not in (ROOT / "cute_kernels/runtime/env.py").read_text()}


def test_switches_read_through_env_only():
    """Nothing reads a CUTE_KERNELS_* variable straight from os.environ: env.get is the one place."""
    direct = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                reads = re.search(r"os\.(environ\.get|getenv)\([^\n]*CUTE_KERNELS_", line) or (
                    re.search(r"os\.environ\[[^\]]*CUTE_KERNELS_[^\]]*\](?!\s*=)", line))
                if reads:
                    direct.append(f"{path.relative_to(ROOT)}:{i}")
    assert not direct, direct


def test_readme_lists_every_switch():
    readme = (ROOT / "README.md").read_text()
    missing = [n for n in env.SWITCHES if f"`{n}`" not in readme]
    assert not missing, f"README's runtime switch table lacks {missing} (env.markdown_table() prints it)"


def test_switch_defaults_and_reads(monkeypatch):
    monkeypatch.delenv("CUTE_KERNELS_GEMV", raising=False)
    assert env.enabled("CUTE_KERNELS_GEMV")
    monkeypatch.setenv("CUTE_KERNELS_GEMV", "0")
    assert not env.enabled("CUTE_KERNELS_GEMV")
