"""CPU tests of inference/: patching, the reference backend, generate, save/load, the decode loop.

A tiny GPT-2 in fp32 with backend="reference" must compute what the stock model
computes (tight tolerance), through the same module swaps, custom ops and
attention registration the GPU path uses.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from inference import ops
from inference.decode import StaticDecoder, hf_generate
from inference.patch import CuteConv1D, CuteGPT2Block, CuteLMHead, patch_model
from tests.model_util import fresh_process_results, vary_weights

ATOL = 1e-4  # logits are O(10) with these weights; fp32 GEMMs differ in summation order


def tiny_gpt2(vocab=1001, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=128, bos_token_id=0,
                     eos_token_id=0, **kw)
    return vary_weights(GPT2LMHeadModel(cfg).eval())


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2()


def ids(batch=2, seq=12, vocab=1001, seed=1):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def patched(model, **kw):
    return patch_model(copy.deepcopy(model), backend="reference", **kw)


def test_patch_keeps_module_tree_state_dict_and_ties(model):
    pm = patched(model)
    assert [n for n, _ in pm.named_modules()] == [n for n, _ in model.named_modules()]
    sd0, sd1 = model.state_dict(), pm.state_dict()
    assert list(sd0) == list(sd1)
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    assert pm.lm_head.weight is pm.transformer.wte.weight  # tie kept, no copy
    blk = pm.transformer.h[0]
    assert isinstance(blk, CuteGPT2Block) and isinstance(pm.lm_head, CuteLMHead)
    assert isinstance(blk.attn.c_attn, CuteConv1D) and isinstance(blk.attn.c_attn, Conv1D)
    assert blk.mlp.c_fc.activation == "gelu_tanh" and isinstance(blk.mlp.act, torch.nn.Identity)
    for m in pm.modules():
        if isinstance(m, Conv1D):  # [in, out] shape, K-major storage: weight.t() is the GEMM operand
            assert m.weight.shape == (m.nx, m.nf) and m.weight.t().is_contiguous()
    # load_state_dict (copy_) keeps the K-major layout
    pm.load_state_dict(sd0)
    assert pm.transformer.h[1].mlp.c_proj.weight.t().is_contiguous()


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
@pytest.mark.parametrize("vocab", [1001, 50257])
def test_patched_logits_equal_original(attention, vocab):
    model = tiny_gpt2(vocab=vocab)
    pm = patched(model, attention=attention)
    x = ids(vocab=vocab)
    with torch.no_grad():
        ref, out = model(x).logits, pm(x).logits
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert pm.config._attn_implementation == ("cute_attn_ref" if attention == "cute" else "sdpa")


def test_ops_are_what_runs(model, monkeypatch):
    """Every GEMM and (attention="cute") every prefill attention goes through our ops."""
    import importlib

    gref = importlib.import_module("cute_kernels.matmul.reference")

    calls = {"linear": 0, "attn": 0}
    real_linear, real_attn = gref.linear_ref, ops.flash_attn_ref

    def count_linear(*a, **k):
        calls["linear"] += 1
        return real_linear(*a, **k)

    def count_attn(*a, **k):
        calls["attn"] += 1
        return real_attn(*a, **k)

    monkeypatch.setattr(gref, "linear_ref", count_linear)
    monkeypatch.setattr(ops, "flash_attn_ref", count_attn)
    pm = patched(model, attention="cute")
    with torch.no_grad():
        pm(ids())
    n_layer = model.config.n_layer
    assert calls == {"linear": 4 * n_layer + 1, "attn": n_layer}


def test_plain_causal_reaches_our_attention_under_capture(model, monkeypatch):
    """Under CUDA graph capture transformers' tracing checks are true, so it overlays a
    packed-sequence mask on GPT-2's own position ids. Plain causal batches must still
    reach our kernel with mask None (not an explicit mask that falls back to SDPA)."""
    import transformers.masking_utils as mu

    x = ids()
    with torch.no_grad():
        ref = model(x, use_cache=False).logits
    monkeypatch.setattr(mu, "is_tracing", lambda *a, **k: True)  # what stream capture makes it return
    calls = {"attn": 0}
    real_attn = ops.flash_attn_ref
    monkeypatch.setattr(ops, "flash_attn_ref", lambda *a, **k: (calls.__setitem__("attn", calls["attn"] + 1), real_attn(*a, **k))[1])
    pm = patched(model, attention="cute")
    with torch.no_grad():
        out = pm(x, use_cache=False).logits
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)
    assert calls["attn"] == model.config.n_layer


def test_packed_positions_and_padding_keep_their_masks(model):
    """Explicit position ids (two sequences packed in one row) and padding masks are
    still honoured: the patched model matches the stock one."""
    pm = patched(model, attention="cute")
    x = ids(batch=1, seq=12)
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    x2 = ids(batch=2, seq=12)
    with torch.no_grad():
        torch.testing.assert_close(pm(x, position_ids=pos, use_cache=False).logits,
                                   model(x, position_ids=pos, use_cache=False).logits, atol=ATOL, rtol=1e-5)
        out, ref = pm(x2, attention_mask=mask, use_cache=False).logits, model(x2, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_greedy_matches(model, attention, cache):
    pm = patched(model, attention=attention)
    x = ids(seq=9)
    ref = hf_generate(model, x, 16, cache=cache)
    assert len(set(ref[0].tolist())) > 3, "degenerate test model"
    assert torch.equal(hf_generate(pm, x, 16, cache=cache), ref)


def test_static_cache_decode_uses_decode_kernel(model, monkeypatch):
    """HF generate with a static cache hands decode steps an explicit boolean mask: they run
    our decode attention (ops.attend_cache with that mask as key mask), not SDPA."""
    calls = []
    real = ops.attend_cache

    def counting(*args):
        calls.append(args[-1] is not None)
        return real(*args)

    monkeypatch.setattr(ops, "attend_cache", counting)
    pm = patched(model, attention="cute")
    x = ids(seq=9)
    assert torch.equal(hf_generate(pm, x, 6, cache="static"), hf_generate(model, x, 6, cache="static"))
    assert calls and all(calls) and len(calls) % model.config.n_layer == 0


def test_save_pretrained_roundtrip(model, tmp_path):
    model.save_pretrained(tmp_path / "orig")
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "orig").eval()
    pm = patch_model(loaded, backend="reference")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(pm(x).logits, model(x).logits, atol=ATOL, rtol=1e-5)
    # a patched model saves a checkpoint the stock class loads
    pm.save_pretrained(tmp_path / "patched")
    back = GPT2LMHeadModel.from_pretrained(tmp_path / "patched").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("which", ["unpatched", "patched-sdpa", "patched-cute"])
def test_static_decoder_matches_hf_generate(model, which):
    m = model if which == "unpatched" else patched(model, attention=which.split("-")[1])
    x = ids(seq=7)
    dec = StaticDecoder(m, batch_size=2, max_len=40)
    assert not dec.cuda_graph
    ref = hf_generate(model, x, 20)
    assert torch.equal(dec.generate(x, 20), ref)
    assert torch.equal(dec.generate(x[:, :5], 20), hf_generate(model, x[:, :5], 20))  # the decoder is reusable


def test_static_decoder_fuses_kv_append(model, monkeypatch):
    """Decode steps write the new k/v rows through ln_linear_kv (the c_attn epilogue on the
    GPU), not index_copy, and still generate the reference tokens."""
    calls = []
    real = ops.ln_linear_kv

    def counting(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(ops, "ln_linear_kv", counting)
    pm = patched(model, attention="cute")
    x = ids(seq=7)
    dec = StaticDecoder(pm, batch_size=2, max_len=40)
    assert torch.equal(dec.generate(x, 6), hf_generate(model, x, 6))
    assert calls and len(calls) % model.config.n_layer == 0 and all(c[0] == 2 for c in calls)


def test_static_decoder_compiled_step(model):
    pm = patched(model)
    x = ids(seq=6)
    dec = StaticDecoder(pm, batch_size=2, max_len=20, compile="aot_eager")
    assert torch.equal(dec.generate(x, 8), hf_generate(model, x, 8))


def test_static_decoder_rejects_bad_sizes(model):
    with pytest.raises(ValueError, match="positions"):
        StaticDecoder(model, batch_size=1, max_len=10_000)
    dec = StaticDecoder(model, batch_size=2, max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        dec.generate(ids(seq=10), 10)
    with pytest.raises(ValueError, match="batch"):
        dec.generate(ids(batch=3, seq=4), 4)


def test_compile_fullgraph_no_graph_break(model):
    pm = patched(model, attention="cute")
    x = ids()
    fn = torch.compile(lambda t: pm(t, use_cache=False).logits, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x).logits, atol=ATOL, rtol=1e-5)


def test_training_mode_falls_back_to_stock_block(model):
    pm = patched(model)
    pm.train()
    pm.config.resid_pdrop = 0.0
    for m in pm.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(pm(x).logits, model(x).logits, atol=ATOL, rtol=1e-5)


def test_patch_argument_errors(model, monkeypatch):
    with pytest.raises(ValueError, match="precision"):
        patched(model, precision="fp4")
    with pytest.raises(ValueError, match="attention"):
        patched(model, attention="flash")
    with pytest.raises(ValueError, match="backend"):
        patch_model(copy.deepcopy(model), backend="triton")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cpu"):  # names the device and what is needed
            patch_model(copy.deepcopy(model), backend="cute")
    import inference.patch as P

    monkeypatch.setattr(P, "_check_cute_device", lambda m: None)
    monkeypatch.setattr(ops, "cute_attention_available", lambda: (False, "not built yet"))
    with pytest.raises(NotImplementedError, match="attention='sdpa'"):
        patch_model(copy.deepcopy(model), backend="cute", attention="cute")


@pytest.mark.parametrize("precision", ["fp8", "fp8-block", "int8", "int8-smoothquant"])
def test_quantized_precisions(model, precision):
    """quant's FP8Linear/Int8Linear replace the Conv1Ds (reference path on CPU); lm_head stays ours."""
    quant = pytest.importorskip("quant")
    x = ids()
    pm = patched(model, precision=precision, calibration=[x] if precision == "int8-smoothquant" else None)
    c_attn = pm.transformer.h[0].attn.c_attn
    assert isinstance(c_attn, (quant.FP8Linear, quant.Int8Linear)) and c_attn.backend == "reference"
    assert isinstance(pm.lm_head, CuteLMHead)
    with torch.no_grad():
        ref, out = model(x).logits, pm(x).logits
    assert float((out - ref).norm() / ref.norm()) < 0.25  # 8-bit error on a deliberately peaky model
    dec = StaticDecoder(pm, batch_size=2, max_len=24)
    assert torch.equal(dec.generate(x, 8), hf_generate(pm, x, 8))


def test_quantized_precision_errors(model, monkeypatch):
    with pytest.raises(ValueError, match="calibration"):
        patched(model, precision="int8-smoothquant")
    monkeypatch.setitem(__import__("sys").modules, "quant", None)  # import quant -> ImportError
    with pytest.raises(NotImplementedError, match="quant"):
        patched(model, precision="fp8")


def test_decode_timeline_summary(tmp_path):
    """timeline_summary on synthetic kernel records of two identical steps: a kernel that
    starts before the one ahead ends adds only what it runs past it, an idle gap counts
    against the kernel after it, and the adds of a step sum to its span."""
    from inference import bench

    dsl = "kernel_cutlass_kernel_cute_kernelsgemmgemv_kernelGemvSm90_object_at__tensorptrbf16_gmem_xyz"

    def step(t0):  # GEMV 0-10 us, attention 6-14 (overlaps 4), GEMV again 16-20 after a 2 us gap
        return [{"name": dsl, "ts": t0, "dur": 10.0, "grid": [150, 1, 1]},
                {"name": "_attn_kernel", "ts": t0 + 6, "dur": 8.0, "grid": [1, 25, 1]},
                {"name": dsl, "ts": t0 + 16, "dur": 4.0, "grid": [200, 1, 1]}]

    # the second step's first kernel starts 1 us before the first step's last one ends
    t = bench.timeline_summary(step(100.0) + step(119.0), 2)
    assert t["steps"] == 2 and t["kernels_per_step"] == 3
    rows = {(r["kernel"], r["grid"]): r for r in t["kinds"]}
    g1 = rows[("gemmgemv_kernelGemvSm90", "(150, 1, 1)")]
    at = rows[("_attn_kernel", "(1, 25, 1)")]
    g2 = rows[("gemmgemv_kernelGemvSm90", "(200, 1, 1)")]
    assert (g1["first"], at["first"], g2["first"]) == (0, 1, 2)
    assert at["mean_overlap_us"] == 4.0 and at["adds_us"] == 4.0 and g2["adds_us"] == 6.0
    assert g1["adds_us"] == (10.0 + 9.0) / 2 and g1["mean_overlap_us"] == 0.5
    assert t["span_us"] in (20.0, 19.0)  # 100..120, then 120..139
    assert sum(r["adds_us"] for r in t["kinds"]) == (20.0 + 19.0) / 2
    assert bench.timeline_summary(step(0.0)[:2], 2) is None  # not two repeats of one sequence
    assert bench.timeline_summary(step(0.0) + step(30.0)[:2], 2) is None  # a record missing
    res = [bench.Result("cute", "bf16", decode_ms_per_step=0.02, timeline=t)]
    meta = {"model": "tiny", "model_tag": "tiny", "gpu": "cpu", "gpu_tag": "cpu", "date": "today", "torch": "x",
            "transformers": "y", "batch": 1, "prompt_len": 4, "gen_len": 12, "attention": "cute",
            "random_weights": True}
    md = bench.write_report(res, [], meta, tmp_path)[1].read_text()
    assert "Decode step timeline" in md and "| 1 | `_attn_kernel` | (1, 25, 1) | 1 | 8.00 | 4.00 | 4.0 |" in md


def test_bench_helpers_on_cpu(model, tmp_path):
    from inference import bench

    cfg = model.config
    e, v, L = cfg.n_embd, cfg.vocab_size, cfg.n_layer
    from inference.adapters import adapter_for

    ad = adapter_for(model)
    assert ad.matmul_params() == L * 12 * e * e + v * e
    assert bench.prefill_flops(ad, 2, 10) == 2 * 2 * 10 * ad.matmul_params() + L * 2 * 2 * 100 * e
    # tied wte/lm_head counted once, wpe left out
    n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    assert bench.weight_bytes(model) == 4 * n
    pm = patched(model)
    x = ids()
    with torch.no_grad():
        b = bench.profile_breakdown(lambda: pm(x, use_cache=False).logits, cuda=False)
    gemms = {tuple(g["mnk"]): g["calls"] for g in b["gemms"]}
    assert all(g["op"] == "cute_inference::linear" for g in b["gemms"])  # inner aten::mm not double counted
    assert gemms[(24, v, e)] == 1 and gemms[(24, 3 * e, e)] == L
    plan = bench.plan_variants(["cute", "cublas"], ["bf16", "fp8"], "no CUDA GPU")
    assert [(p[0], p[1], p[2] is None) for p in plan] == [
        ("cute", "bf16", False), ("cute", "fp8", False), ("cublas", "bf16", True), ("cublas", "fp8", False)]
    res = [bench.Result("cublas", "bf16", prefill_ms=1.0, prefill_tok_s=1e4, mfu_pct=1.0, decode_ms_per_step=0.5,
                        decode_tok_s=4e3, mbu_pct=2.0, peak_gib=1.0, breakdown={"prefill": b})]
    meta = {"model": "tiny", "model_tag": "tiny", "gpu": "cpu", "gpu_tag": "cpu", "date": "today", "torch": "x",
            "transformers": "y", "batch": 2, "prompt_len": 12, "gen_len": 4, "attention": "sdpa",
            "random_weights": True}
    paths = bench.write_report(res, [("cute", "bf16", "no GPU")], meta, tmp_path)
    import json

    data = json.loads(paths[0].read_text())
    assert data["results"][0]["backend"] == "cublas" and data["skipped"][0][2] == "no GPU"
    md = paths[1].read_text()
    assert "| cublas | bf16 |" in md and "cute_inference::linear" in md and "Random weights" in md


_UNTOUCHED_SCRIPT = """
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64)
model = GPT2LMHeadModel(cfg).eval()
x = torch.randint(0, 300, (2, 12))
mask = torch.ones(2, 12, dtype=torch.long)
mask[1, :3] = 0
pos = torch.cat([torch.arange(5), torch.arange(7)])[None].expand(2, -1)
if sys.argv[1] == "patch":  # another model, built from the same config object, patched first
    from inference.patch import patch_model

    impl = model.config._attn_implementation
    other = patch_model(GPT2LMHeadModel(cfg).eval(), attention="cute", backend="reference")
    assert model.config._attn_implementation == impl, "patching switched another model's attention"
    with torch.no_grad():
        other(x, use_cache=False)
with torch.no_grad():
    outs = [model(x, use_cache=False).logits, model(x).logits, model(x, attention_mask=mask).logits,
            model(x, position_ids=pos, use_cache=False).logits,
            model.generate(x[:1], max_new_tokens=5, do_sample=False, pad_token_id=0)]
torch.save(outs, sys.argv[2])
"""


def test_patching_one_model_leaves_another_bit_identical(tmp_path):
    """An unpatched GPT-2 in a process that patched another one (built from the same config
    object) gives bit-identical results to a process that never patched anything."""
    outs = fresh_process_results(_UNTOUCHED_SCRIPT, ("plain", "patch"), tmp_path)
    for a, b in zip(outs["plain"], outs["patch"]):
        assert torch.equal(a, b)


def test_gpt2_adapter(model):
    from inference.adapters import adapter_for

    ad = adapter_for(model)
    cfg = model.config
    assert (ad.n_layers, ad.n_heads, ad.head_dim, ad.hidden) == (cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head,
                                                                 cfg.n_embd)
    assert ad.matmul_params() == cfg.n_layer * 12 * cfg.n_embd ** 2 + cfg.vocab_size * cfg.n_embd
    layers = ad.layers()
    assert len(layers) == cfg.n_layer and layers[0].qkv is model.transformer.h[0].attn.c_attn
    x, pos = ids(), torch.arange(ids().shape[1])
    torch.testing.assert_close(ad.embed(x, pos), model.transformer.wte(x) + model.transformer.wpe(pos))
    with pytest.raises(ValueError, match="no model adapter for model_type='bert'"):
        adapter_for(type("M", (), {"config": type("C", (), {"model_type": "bert"})()})())
