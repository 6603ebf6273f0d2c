"""Compile recipes, manifests and parallel precompilation (CPU: the compile tier)."""

import dataclasses
import functools
import json
import subprocess
import sys

import pytest
import torch

from cute_kernels.matmul.config import GemmConfig


def _gemm_entry(tile=(64, 64)):
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.runtime import CompileKey

    cfg, epi = GemmConfig(*tile, 1, 1, pingpong=True), Epilogue(activation="gelu_tanh", bias=True)
    rec = functools.partial(_compile, torch.bfloat16, torch.bfloat16, torch.bfloat16, "k", "k", cfg, epi, "Float32")
    return CompileKey.of("gemm_sm90", rec), rec


def test_recipe_json_round_trip():
    from cute_kernels.runtime import recipe

    key, rec = _gemm_entry()
    back = recipe.from_json(json.loads(json.dumps(recipe.to_json(rec))))
    assert back.func is rec.func and back.args == rec.args and back.keywords == rec.keywords
    with pytest.raises(TypeError, match="plain data"):
        recipe.to_json(functools.partial(print, object()))


def test_manifest_merge_and_stale_entries(tmp_path, capsys):
    from cute_kernels.precompile import load_manifest, save_manifest

    path = tmp_path / "m.json"
    a, b = _gemm_entry((64, 64)), _gemm_entry((128, 128))
    assert save_manifest(path, [a]) == 1
    assert save_manifest(path, [a, b]) == 2  # merged, no duplicates
    assert sorted(k.digest() for k, _ in load_manifest(path)) == sorted(k.digest() for k in (a[0], b[0]))
    assert [k for k, _ in load_manifest(path, resolve=False)] == [k for k, _ in load_manifest(path)]
    data = json.loads(path.read_text())
    data["kernels"][0]["recipe"]["fn"] = "cute_kernels.matmul.api:no_such_function"
    path.write_text(json.dumps(data))
    assert len(load_manifest(path)) == 1 and "stale manifest entry" in capsys.readouterr().err


def test_manifest_recorded_before_a_config_field_was_added_names_todays_key(tmp_path):
    """A recipe written before a config field (with a default) existed has the key a process
    computes for the same kernel today, resolved or not, and a merge rewrites it whole."""
    from cute_kernels.precompile import load_manifest, save_manifest

    path = tmp_path / "m.json"
    key, rec = _gemm_entry((64, 64))
    save_manifest(path, [(key, rec)])
    data = json.loads(path.read_text())
    fields = data["kernels"][0]["recipe"]["args"][5]["fields"]
    assert fields.pop("group") is not None  # as if recorded before GemmConfig.group existed
    path.write_text(json.dumps(data))
    assert [k for k, _ in load_manifest(path, resolve=False)] == [key] == [k for k, _ in load_manifest(path)]
    save_manifest(path, [])
    assert "group" in json.loads(path.read_text())["kernels"][0]["recipe"]["args"][5]["fields"]


@pytest.mark.compile
def test_precompile_fills_the_disk_cache_in_workers(tmp_path, monkeypatch):
    """Two kernels built by worker processes; a fresh KernelCache then loads both from disk
    without compiling, and a second precompile finds nothing to do."""
    from cute_kernels.precompile import precompile, save_manifest
    from cute_kernels.runtime.cache import KernelCache, object_path

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUTE_KERNELS_DISK_CACHE", raising=False)
    entries = [_gemm_entry((64, 64)), _gemm_entry((128, 128))]
    stats = precompile(entries, jobs=2)
    assert (stats["compiled"], stats["failed"]) == (2, 0)
    assert all(object_path(k).exists() for k, _ in entries)
    cache = KernelCache()

    def never():
        raise AssertionError("compiled although precompile built the kernel")

    for key, _ in entries:
        cache.get(key, never)
    assert cache.stats["disk_loads"] == 2 and cache.stats["compiles"] == 0
    assert precompile(entries, jobs=2)["cached"] == 2
    # the CLI replays a manifest file the same way
    save_manifest(tmp_path / "m.json", entries)
    out = subprocess.run([sys.executable, "-m", "cute_kernels.precompile", "--manifest", str(tmp_path / "m.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "0 compiled, 2 already cached" in out.stdout, out.stdout + out.stderr


def test_shipped_manifests_resolve():
    """Every shipped manifest entry still names a compile function and config fields that exist."""
    from cute_kernels.precompile import available_manifests, load_manifest, manifest_path

    for name in available_manifests():
        data = json.loads(manifest_path(name).read_text())
        assert len(load_manifest(manifest_path(name))) == len(data["kernels"]), name


@pytest.mark.compile
def test_record_writes_the_kernels_a_process_used(tmp_path):
    script = (
        "import sys; sys.path.insert(0, 'tests'); from test_precompile import _gemm_entry\n"
        "from cute_kernels.runtime import KERNELS\n"
        "key, rec = _gemm_entry(); KERNELS.get(key, rec)\n"
    )
    env = {**__import__("os").environ, "CUTE_KERNELS_RECORD": str(tmp_path / "rec.json"),
           "CUTE_KERNELS_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (entry,) = json.loads((tmp_path / "rec.json").read_text())["kernels"]
    assert entry["kernel"] == "gemm_sm90" and entry["recipe"]["fn"] == "cute_kernels.matmul.api:_compile"


def test_every_dsl_kernel_lives_where_the_disk_cache_fingerprint_looks():
    """The disk cache is keyed by a hash of cute_kernels/**.py: a CuTe DSL kernel defined or
    cached from another package would outlive an edit of its source."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    outside = [p.relative_to(root).as_posix() for pkg in ("inference", "quant", "baselines", "benchmarks")
               for p in (root / pkg).rglob("*.py") if "@cute.kernel" in p.read_text() or "KERNELS.get(" in p.read_text()]
    assert not outside, outside


def _changed(value):
    if value is None:  # GemmConfig.stages: the default ring
        return 4
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2
    if isinstance(value, str):
        return {"none": "relu", "vector": "scalar"}.get(value, "none")
    raise TypeError(value)


def test_every_gemm_config_and_epilogue_field_changes_the_compile_key(gemm_keys):
    """A compile-time field missing from the key lets two kernels shadow each other in every
    cache. GemmConfig.split_k is the one runtime value: only "split or not" is compiled in."""
    from cute_kernels.matmul.config import Epilogue

    cfg, epi = GemmConfig(128, 128, 1, 1, split_k=2), Epilogue()
    base = gemm_keys(cfg, epi)
    for f in dataclasses.fields(cfg):
        if f.name == "split_k":
            continue
        assert gemm_keys(dataclasses.replace(cfg, **{f.name: _changed(getattr(cfg, f.name))}), epi) != base, f.name
    for f in dataclasses.fields(epi):
        assert gemm_keys(cfg, dataclasses.replace(epi, **{f.name: _changed(getattr(epi, f.name))})) != base, f.name
    assert gemm_keys(dataclasses.replace(cfg, split_k=1), epi) != base
    assert gemm_keys(dataclasses.replace(cfg, split_k=7), epi) == base


def test_compile_key_is_the_recipe():
    """The key is derived from the compile function and every argument: equal recipes give
    one key (also through JSON), any changed argument another."""
    from cute_kernels.runtime import CompileKey, recipe

    key, rec = _gemm_entry()
    assert CompileKey.of("gemm_sm90", recipe.to_json(rec)) == key
    assert CompileKey.of("gemm_sm90", recipe.from_json(json.loads(json.dumps(recipe.to_json(rec))))) == key
    other = functools.partial(rec.func, *rec.args[:-1], "Int32")
    assert CompileKey.of("gemm_sm90", other) != key and CompileKey.of("gemm_other", rec) != key


def test_distinct_gemv_and_attention_builds_never_share_a_compile_key(recorded_builds):
    """Whatever the host code varies, two different compile recipes must not get one key (they
    would shadow each other in every cache). Recorded without compiling anything."""
    import itertools

    from cute_kernels.attention import api as attn
    from cute_kernels.matmul import gemv

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    seen: dict = {}

    def check():
        rid = _recipe_id(recorded_builds[recorded_builds.last])
        assert seen.setdefault(recorded_builds.last, rid) == rid, f"two builds share {recorded_builds.last}"

    for w_dt, (N, K), act, bias, res, alpha, ln, kv in itertools.product(
            (bf16, fp8), ((2304, 768), (3072, 768), (768, 3072), (50257, 1600)), (None, "gelu_tanh"), (False, True),
            (False, True), (False, True), (False, True), (None, (torch.bfloat16,))):
        gemv._gemv_sm90_kernel(torch.bfloat16, w_dt, torch.bfloat16, N, K, act, bias, res, alpha, False, ln, kv)
        check()
    configs = {attn.prefill_config(D, sq) for D in attn.HEAD_DIMS for sq in (1024, 4096)}
    configs |= {dataclasses.replace(c, stages=c.stages + 1) for c in configs if c.head_dim in (64, 128)}
    for dt, cfg, causal, lk, lq, split in itertools.product(
            (bf16, torch.float16), configs, (False, True), (False, True), (False, True), (False, True)):
        attn._kernel(dt, cfg, causal, lk, lq, split)
        check()
    decode = [attn.decode_config(D) for D in attn.HEAD_DIMS] + [attn.decode_config(64, 1 << 20, s) for s in (0, 8192)]
    decode += [attn.decode_mma_config(D) for D in (64, 128)]
    for cfg, heads, split, lens, masked, cluster, et in itertools.product(
            decode, (1, 2, 4), (False, True), (False, True), (False, True), (1, 4), (False, True)):
        if cluster == 1 or split:
            attn._decode_kernel(bf16, cfg, heads, split, lens, masked, cluster, et)
            check()
    assert len(seen) > 1000


def _recipe_id(rec):
    return (rec.func, rec.args, tuple(sorted(rec.keywords.items())))


def _changed_attn(value):
    return 16 if value is None else _changed(value)


def test_every_attention_config_field_changes_the_compile_key(recorded_builds):
    """Every field of PrefillConfig, DecodeConfig and DecodeMmaConfig is compiled into the
    kernel: each must change its compile key."""
    from cute_kernels.attention import api
    from cute_kernels.attention.config import decode_config, decode_mma_config, prefill_config

    def prefill_key(cfg):
        api._kernel(torch.bfloat16, cfg, True, False, False, False)
        return recorded_builds.last

    def decode_key(cfg):
        api._decode_kernel(torch.bfloat16, cfg, 4, True, True, False, 1, False)
        return recorded_builds.last

    for cfg in (prefill_config(64, 1024), prefill_config(128, 1024)):  # exps_before_pv_wait set / None
        base = prefill_key(cfg)
        for f in dataclasses.fields(cfg):
            other = dataclasses.replace(cfg, **{f.name: _changed_attn(getattr(cfg, f.name))})
            assert other != cfg and prefill_key(other) != base, f.name
    for cfg in (decode_config(64), decode_mma_config(128)):
        base = decode_key(cfg)
        for f in dataclasses.fields(cfg):
            assert decode_key(dataclasses.replace(cfg, **{f.name: _changed_attn(getattr(cfg, f.name))})) != base, f.name


def test_json_recipes_stay_json_in_a_manifest(tmp_path):
    """Kernels preloaded from a manifest keep its JSON as their recipe: recording them again
    writes the same entry, and nothing imported a kernel module to do so."""
    from cute_kernels.precompile import JsonRecipe, load_manifest, save_manifest

    key, rec = _gemm_entry()
    save_manifest(tmp_path / "a.json", [(key, rec)])
    ((k, raw),) = load_manifest(tmp_path / "a.json", resolve=False)
    assert k == key and not callable(raw)
    save_manifest(tmp_path / "b.json", [(k, JsonRecipe(raw))])
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a.json").read_text())


# --------------------------------------------------------------------------- Triton kernels in manifests


def _triton_entry(fn="tests.test_precompile:_no_such_kernel", spec='{"name": "x"}', cache_dir="ABC"):
    return {"fn": fn, "spec": spec, "cache_dir": cache_dir}


def test_manifest_keeps_triton_specializations_once(tmp_path):
    from cute_kernels.precompile import load_manifest, load_triton, save_manifest

    path = tmp_path / "m.json"
    a, b = _triton_entry(spec='{"a": 1}'), _triton_entry(spec='{"b": 2}')
    save_manifest(path, [_gemm_entry()], [a])
    save_manifest(path, [], [a, b])  # merged: the DSL kernel stays, `a` is not listed twice
    assert len(load_manifest(path)) == 1
    assert sorted(t["spec"] for t in load_triton(path)) == ['{"a": 1}', '{"b": 2}']


def test_triton_recorder_notes_the_compiled_specialization(monkeypatch):
    """The post-compile hook stores Triton's own specialization data and the cache directory of
    the compiled kernel; a hook that was already installed still runs."""
    pytest.importorskip("triton")
    import types

    from triton import knobs
    from triton.runtime.cache import _base32

    from cute_kernels.runtime import triton_warm

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["key"]))
    monkeypatch.setattr(triton_warm, "_RECORDED", {})
    kernel = types.SimpleNamespace(hash="ab" * 32)
    jit = types.SimpleNamespace(fn=types.SimpleNamespace(__module__="tests.test_precompile", __qualname__="_fake_jit"),
                                device_caches={0: ({"k": kernel},)})
    monkeypatch.setitem(globals(), "_fake_jit", jit)
    triton_warm.install_recorder()
    knobs.runtime.jit_post_compile_hook(key="k", repr="", fn=types.SimpleNamespace(jit_function=jit),
                                        compile={"device": 0, "specialization_data": '{"s": 1}'},
                                        is_manual_warmup=False, already_compiled=False)
    assert seen == ["k"]
    assert triton_warm.recorded() == [{"fn": "tests.test_precompile:_fake_jit", "spec": '{"s": 1}',
                                       "cache_dir": _base32("ab" * 32)}]
    # a preload (Triton's warm-up path) is not recorded: replaying a manifest must not grow it
    knobs.runtime.jit_post_compile_hook(key="k", repr="", fn=types.SimpleNamespace(jit_function=jit),
                                        compile={"device": 0, "specialization_data": '{"s": 2}'},
                                        is_manual_warmup=True, already_compiled=False)
    assert len(triton_warm.recorded()) == 1 and seen == ["k", "k"]


def test_triton_preload_failure_is_a_status_not_an_error(tmp_path, monkeypatch):
    from cute_kernels.runtime import triton_warm

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    name, status, _ = triton_warm.preload(_triton_entry())
    assert name.endswith("_no_such_kernel") and status.startswith("failed: AttributeError")
    (tmp_path / "ABC").mkdir()
    (tmp_path / "ABC" / "__grp__k.json").write_text("{}")
    assert triton_warm.is_cached(_triton_entry()) and triton_warm.preload(_triton_entry())[1] == "cached"


def test_precompile_builds_the_triton_kernels_without_a_gpu(tmp_path, monkeypatch):
    """A CPU machine's precompile compiles the shipped manifest's Triton specializations for
    sm_90 into Triton's cache, although they were recorded on a GPU machine whose libdevice
    lives at another path; a failed record is counted, not raised, and leaves no marker that
    would stop the GPU machine from trying it."""
    pytest.importorskip("triton")
    import cute_kernels.precompile as pc
    from cute_kernels.runtime import triton_warm

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton_warm, "_has_gpu", lambda: False)
    shipped = [t for t in pc.load_triton(pc.manifest_path("gpt2-bf16")) if not t["fn"].endswith("_gemv_kernel")]
    assert shipped and all("/" in str(json.loads(t["spec"])["options"].get("extern_libs")) for t in shipped)
    for entry in shipped:
        name, status, _ = triton_warm.preload(entry)
        assert status == "compiled", (name, status)
    groups = list(tmp_path.glob("*/__grp__*.json"))
    assert len(groups) == len(shipped)
    assert all(json.loads(g.read_text()) for g in groups)
    name, status, _ = triton_warm.preload(_triton_entry())
    assert status.startswith("failed") and not list(tmp_path.glob("*.preloaded"))


@pytest.mark.gpu
def test_triton_kernels_recorded_then_preloaded_into_an_empty_cache(tmp_path):
    """A process records the Triton kernels it compiled; precompile, with another empty Triton
    cache, compiles exactly those there, and a process launching them then compiles nothing."""
    script = (
        "import torch; from cute_kernels.matmul.gemv import skinny_gemm\n"
        "x = torch.randn(2, 512, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.randn(384, 512, device='cuda', dtype=torch.bfloat16)\n"
        "torch.testing.assert_close(skinny_gemm(x, w, None, None).float(), (x.float() @ w.float().T), "
        "rtol=2e-2, atol=2e-1); torch.cuda.synchronize()\n"
    )
    base = {**__import__("os").environ, "CUTE_KERNELS_CACHE_DIR": str(tmp_path / "ck")}
    env1 = {**base, "CUTE_KERNELS_RECORD": str(tmp_path / "m.json"), "TRITON_CACHE_DIR": str(tmp_path / "t1")}
    out = subprocess.run([sys.executable, "-c", script], env=env1, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    from cute_kernels.precompile import load_triton

    recorded = load_triton(tmp_path / "m.json")
    assert recorded and all(t["fn"] == "cute_kernels.matmul.gemv:_gemv_kernel" for t in recorded)
    env2 = {**base, "TRITON_CACHE_DIR": str(tmp_path / "t2")}
    out = subprocess.run([sys.executable, "-m", "cute_kernels.precompile", "--manifest", str(tmp_path / "m.json")],
                         env=env2, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "(Triton): compiled" in out.stdout, out.stdout + out.stderr
    before = set((tmp_path / "t2").iterdir())
    out = subprocess.run([sys.executable, "-c", script], env=env2, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert set((tmp_path / "t2").iterdir()) == before  # every kernel came from the cache


def test_startup_benchmark_reads_the_commands_breakdown_and_needs_a_gpu():
    from benchmarks.startup import parse_startup

    text = ("text\n--- startup ---\nwall 9.9 s: imports 4.1, model 0.2, kernels 3.0, first step 0.7, generate 0.0, "
            "compare 0.4; 20 kernels and 5 Triton kernels compiled in parallel (7.1 s); kernels in this process: "
            "20 loaded from the disk cache (0.2 s), 0 compiled (0.0 s)")
    row = parse_startup(text)
    assert row["phases_s"] == {"imports": 4.1, "model": 0.2, "kernels": 3.0, "first step": 0.7, "generate": 0.0,
                               "compare": 0.4}
    assert (row["kernels_compiled_in_parallel"], row["triton_compiled_in_parallel"], row["kernels_loaded"]) == (20, 5, 20)
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "benchmarks.startup"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_shipped_triton_records_match_the_kernels_signatures():
    """A recorded specialization names every parameter of its kernel: one recorded before a
    parameter was added would only fail its preload (and cost a cold start its head start)."""
    pytest.importorskip("triton")
    import importlib

    from cute_kernels.precompile import available_manifests, load_triton, manifest_path

    for name in available_manifests():
        for t in load_triton(manifest_path(name)):
            module, fn = t["fn"].split(":")
            jit = getattr(importlib.import_module(module), fn)
            assert list(json.loads(t["spec"])["signature"]) == list(jit.arg_names), (name, t["fn"])
