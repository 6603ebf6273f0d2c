"""benchmarks.gemm --merge: one held-out grid assembled from its --slice files (pure data: no GPU)."""

import json

import pytest


def _slice_file(path, seed, part, rows_for, **summary_extra):
    from benchmarks.common import results_json
    from benchmarks.gemm import grid_shapes

    rows = []
    for name, M, N, K in grid_shapes(seed, 4)[part]:
        case = f"bf16-{M}x{N}x{K}-{name}"
        for prov, ms in rows_for(case).items():
            rows.append({"case": case, "provider": prov, "ms": ms, "extra": {"dtype": "bf16"}})
    summary = {"seed": seed, "count": 4, "rounds": 3, "cublas_padded": True, "tuning_cache": True,
               "tuning_entries": 0, "slice": f"{part.start}:{part.stop}", **summary_extra}
    path.write_text(results_json({"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-20", "rows": rows,
                                  "summary": summary}))
    return path


def test_merge_recomputes_the_summary_over_every_slice(tmp_path, monkeypatch):
    from benchmarks.gemm import main

    monkeypatch.setenv("CUTE_KERNELS_RESULTS_DIR", str(tmp_path / "out"))
    a = _slice_file(tmp_path / "a.json", 7, slice(0, 2), lambda c: {"cute": 1.0, "cublas": 2.0, "quack": 1.5})
    b = _slice_file(tmp_path / "b.json", 7, slice(2, 4), lambda c: {"cute": 2.0, "cublas": 1.0})
    rows, s = main(["--merge", str(a), str(b)])
    assert len(rows) == 10 and s["cases_timed"] == {"bf16": 4} and "missing" not in s
    assert s["geomean_speedup_vs_cublas"]["bf16"] == pytest.approx(1.0)
    assert s["min_speedup_vs_cublas"]["bf16"] == pytest.approx(0.5)
    assert s["geomean_speedup_vs_quack"]["bf16"] == pytest.approx(1.5) and s["cases_with_quack"] == {"bf16": 2}
    out = json.loads((tmp_path / "out" / "gemm_grid_h100.json").read_text())
    assert out["gpu"] == "NVIDIA H100 80GB HBM3" and out["date"] == "2026-11-20" and len(out["summary"]["merged_from"]) == 2
    # A part of the draw no slice timed is named, not silently dropped.
    _, s = main(["--merge", str(a), "--no-write"])
    assert len(s["missing"]) == 2 and s["cases_timed"] == {"bf16": 2}


def test_merge_refuses_slices_of_different_grids(tmp_path):
    from benchmarks.gemm import merge_grid

    a = _slice_file(tmp_path / "a.json", 7, slice(0, 2), lambda c: {"cute": 1.0, "cublas": 1.0})
    other_seed = _slice_file(tmp_path / "s.json", 8, slice(2, 4), lambda c: {"cute": 1.0, "cublas": 1.0})
    with pytest.raises(ValueError, match="seed"):
        merge_grid([a, other_seed])
    tuned = _slice_file(tmp_path / "t.json", 7, slice(2, 4), lambda c: {"cute": 1.0, "cublas": 1.0}, tuning_entries=3)
    with pytest.raises(ValueError, match="tuning_entries"):
        merge_grid([a, tuned])
    twice = _slice_file(tmp_path / "d.json", 7, slice(1, 3), lambda c: {"cute": 1.0, "cublas": 1.0})
    with pytest.raises(ValueError, match="in both"):
        merge_grid([a, twice])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a grid results file"):
        merge_grid([a, tmp_path / "bad.json"])
    with pytest.raises(SystemExit, match="error: .*seed"):
        from benchmarks.gemm import main

        main(["--merge", str(a), str(other_seed)])
