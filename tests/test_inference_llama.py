"""CPU tests of the Llama family (Llama, Qwen2, Mistral) on inference/: patching, GQA, the
sliding window, greedy decoding, isolation, the adapter and the published configs.

Tiny random models in fp32 with backend="reference" run the same module swaps, custom ops
and attention registration as the GPU path, and must compute what the stock model does.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference import ops
from inference.adapters import LlamaAdapter, adapter_for
from inference.decode import EagerDecoder, StaticDecoder, hf_generate
from inference.decode_llama import LlamaStaticDecoder, concat_rows
from inference.decoders import decoder_for
from inference.patch import CuteLinear, CuteLMHead, patch_model
from inference.patch_llama import CuteLlamaAttention, CuteMistralDecoderLayer, CuteQwen2DecoderLayer
from tests.model_util import fresh_process_results, vary_weights

VOCAB = 1001
KINDS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
         "mistral": (MistralConfig, MistralForCausalLM)}


def tiny(kind="llama", seed=0, **kw):
    """2 layers, 4 query heads on 2 KV heads (GQA) of 16; Qwen2 has its q/k/v biases."""
    cfg_cls, model_cls = KINDS[kind]
    args = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=0,
                eos_token_id=0, pad_token_id=0)
    args.update(kw)
    torch.manual_seed(seed)
    return vary_weights(model_cls(cfg_cls(**args)).eval())


def ids(batch=2, seq=12, seed=1):
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def patched(model, **kw):
    return patch_model(copy.deepcopy(model), backend="reference", **kw)


def close(out, ref):
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


@pytest.fixture(scope="module", params=list(KINDS))
def model(request):
    return tiny(request.param)


def test_patch_swaps_classes_and_keeps_state_dict(model):
    pm = patched(model)
    assert [n for n, _ in pm.named_modules()] == [n for n, _ in model.named_modules()]
    sd0, sd1 = model.state_dict(), pm.state_dict()
    assert list(sd0) == list(sd1) and all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    layer = pm.model.layers[0]
    assert type(layer).__name__.startswith("Cute") and type(layer.self_attn).__name__.startswith("Cute")
    for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
        assert isinstance(lin, CuteLinear) and lin.backend == "reference"
    assert isinstance(pm.lm_head, CuteLMHead)
    assert (layer.self_attn.q_proj.bias is not None) == (model.config.model_type == "qwen2")
    assert type(layer.mlp) is type(model.model.layers[0].mlp)  # the SiLU-gated MLP module stays stock


def test_tied_head_stays_tied():
    pm = patched(tiny("llama", tie_word_embeddings=True))
    assert pm.lm_head.weight is pm.model.embed_tokens.weight and isinstance(pm.lm_head, CuteLMHead)


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
def test_patched_logits_equal_original(model, attention):
    pm = patched(model, attention=attention)
    x = ids()
    with torch.no_grad():
        close(pm(x).logits, model(x).logits)
    assert pm.config._attn_implementation == ("cute_attn_ref" if attention == "cute" else "sdpa")


def test_ops_are_what_runs(model, monkeypatch):
    """Every linear (7 per layer and the head; fp32: no SwiGLU fusion) and every prefill
    attention run our ops."""
    import importlib

    gref = importlib.import_module("cute_kernels.matmul.reference")
    calls = {"linear": 0, "residual": 0, "attn": 0}
    real_linear, real_attn = gref.linear_ref, ops.flash_attn_ref

    def count_linear(*a, **k):
        calls["linear"] += 1
        calls["residual"] += k.get("residual") is not None
        return real_linear(*a, **k)

    def count_attn(q, k, *a, **kw):
        calls["attn"] += 1
        assert q.shape[2] == 2 * k.shape[2]  # GQA: k/v keep their 2 heads
        return real_attn(q, k, *a, **kw)

    monkeypatch.setattr(gref, "linear_ref", count_linear)
    monkeypatch.setattr(ops, "flash_attn_ref", count_attn)
    pm = patched(model, attention="cute")
    with torch.no_grad():
        pm(ids(), use_cache=False)
    L = model.config.num_hidden_layers
    assert calls == {"linear": 7 * L + 1, "residual": 2 * L, "attn": L}


def test_plain_causal_reaches_our_attention_under_capture(model, monkeypatch):
    """Under CUDA graph capture transformers' tracing checks are true, so it overlays a
    packed-sequence mask on the base model's own arange positions. A plain causal prefill
    must still reach our attention with mask None (not an explicit mask and SDPA); so must
    Mistral's, whose default 4096-token window is longer than the sequence."""
    import transformers.masking_utils as mu

    x = ids()
    with torch.no_grad():
        ref = model(x, use_cache=False).logits
    pm = patched(model, attention="cute")
    calls = {"attn": 0}
    real_attn = ops.flash_attn_ref

    def count_attn(*a, **k):
        calls["attn"] += 1
        return real_attn(*a, **k)

    monkeypatch.setattr(ops, "flash_attn_ref", count_attn)
    with torch.no_grad():
        close(pm(x, use_cache=False).logits, ref)
        monkeypatch.setattr(mu, "is_tracing", lambda *a, **k: True)  # what stream capture makes it return
        close(pm(x, use_cache=False).logits, ref)
    L = model.config.num_hidden_layers
    assert calls["attn"] == 2 * L


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("heads", [(6, 2), (6, 6), (4, 1)])
def test_gqa_group_sizes(kind, heads):
    """Groups of 3 (not a power of two, as Qwen2.5's 7 and 5), MHA, and MQA."""
    m = tiny(kind, num_attention_heads=heads[0], num_key_value_heads=heads[1], hidden_size=16 * heads[0])
    x = ids()
    with torch.no_grad():
        ref = m(x).logits
        close(patched(m, attention="cute")(x).logits, ref)
    ad = adapter_for(m)
    assert (ad.n_heads, ad.n_kv_heads, ad.head_dim) == (*heads, 16)


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_tokens_match(model, attention, batch):
    """32 greedy tokens: the patched model through its static decoder (the CLI's loop), through
    EagerDecoder and through transformers' generate with a static cache equal the unpatched
    model's generate."""
    pm = patched(model, attention=attention)
    x = ids(batch=batch, seq=7)
    ref = hf_generate(model, x, 32)
    assert len(set(ref[0].tolist())) > 3, "degenerate test model"
    dec = decoder_for(pm, batch_size=batch, max_len=40)
    assert isinstance(dec, LlamaStaticDecoder) and not dec.cuda_graph  # no graph on the CPU
    assert torch.equal(dec.generate(x, 32), ref)
    assert torch.equal(EagerDecoder(pm, batch_size=batch, max_len=40).generate(x, 32), ref)
    assert torch.equal(hf_generate(pm, x, 32, cache="static"), ref)


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
def test_left_padding(model, attention):
    """A left-padded batch of 4 with its attention mask: same logits at the real positions
    and the same greedy tokens (transformers' generate, dynamic and static cache)."""
    pm = patched(model, attention=attention)
    x = ids(batch=4, seq=10)
    mask = torch.ones_like(x)
    for row, pad in enumerate((0, 3, 1, 6)):
        mask[row, :pad] = 0
        x[row, :pad] = 0
    with torch.no_grad():
        out, ref = pm(x, attention_mask=mask).logits, model(x, attention_mask=mask).logits
    close(out[mask.bool()], ref[mask.bool()])
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    for cache in ({}, {"cache_implementation": "static"}):
        assert torch.equal(pm.generate(x, **kw, **cache), model.generate(x, **kw, **cache))


@pytest.mark.parametrize("attention", ["sdpa", "cute"])
def test_mistral_sliding_window_shorter_than_the_sequence(attention):
    """A window of 5 over 12 tokens reaches our attention as an explicit mask, and decode
    steps past the window attend to the last 5 keys only."""
    m = tiny("mistral", sliding_window=5)
    pm = patched(m, attention=attention)
    x = ids(seq=12)
    with torch.no_grad():
        ref = m(x).logits
        close(pm(x).logits, ref)
        full = tiny("mistral", sliding_window=None)(x).logits  # the window really changes the result
    assert float((full - ref).abs().max()) > 1e-2
    for cache in ("dynamic", "static"):
        assert torch.equal(hf_generate(pm, x, 16, cache=cache), hf_generate(m, x, 16, cache=cache))
    assert torch.equal(decoder_for(pm, batch_size=2, max_len=40).generate(x, 16), hf_generate(m, x, 16))


def test_static_cache_decode_uses_decode_kernel_with_gqa(model, monkeypatch):
    calls = []
    real = ops.attend_cache

    def counting(q, k_cache, *args):
        calls.append((q.shape[2], k_cache.shape[2]))
        return real(q, k_cache, *args)

    monkeypatch.setattr(ops, "attend_cache", counting)
    pm = patched(model, attention="cute")
    x = ids(seq=9)
    assert torch.equal(hf_generate(pm, x, 6, cache="static"), hf_generate(model, x, 6, cache="static"))
    assert calls and set(calls) == {(4, 2)} and len(calls) % model.config.num_hidden_layers == 0


def test_training_mode_falls_back_to_stock_layer():
    m = tiny("qwen2")
    pm = patched(m)
    pm.train()
    x = ids()
    with torch.no_grad():
        close(pm(x).logits, m(x).logits)


def test_compile_fullgraph_no_graph_break():
    m = tiny("llama")
    pm = patched(m, attention="cute")
    x = ids()
    fn = torch.compile(lambda t: pm(t, use_cache=False).logits, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        close(fn(x), m(x).logits)


@pytest.mark.parametrize("precision", ["fp8", "fp8-block", "int8", "int8-smoothquant"])
def test_quantized_precisions(model, precision):
    """quant's FP8Linear/Int8Linear replace every projection (reference path on CPU), lm_head
    stays ours, the residual adds stay in the o_proj / down_proj epilogues, and the static
    decoder runs the quantized model token for token as its own generate does."""
    quant = pytest.importorskip("quant")
    x = ids()
    pm = patched(model, precision=precision, calibration=[x] if precision == "int8-smoothquant" else None)
    layer = pm.model.layers[0]
    for lin in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.down_proj):
        assert isinstance(lin, (quant.FP8Linear, quant.Int8Linear)) and lin.backend == "reference"
    assert layer.self_attn.o_proj.fuses_residual and layer.mlp.down_proj.fuses_residual
    assert isinstance(pm.lm_head, CuteLMHead) and layer.backend == layer.self_attn.backend == "reference"
    with torch.no_grad():
        ref, out = model(x).logits, pm(x).logits
    assert float((out - ref).norm() / ref.norm()) < 0.25  # 8-bit error on a deliberately peaky model
    dec = decoder_for(pm, batch_size=2, max_len=24)
    assert torch.equal(dec.generate(x, 8), hf_generate(pm, x, 8))


@pytest.mark.parametrize("kind,precision", [("llama", "fp8"), ("qwen2", "int8"), ("mistral", "fp8")])
def test_quantized_decode_shortcuts(monkeypatch, kind, precision):
    """CUTE_KERNELS_LLAMA_8BIT_DECODE: the static decoder of an 8-bit model concatenates q/k/v
    and gate/up with their scales (the modules' weights re-pointed, not copied) and takes the
    16-bit step's RMSNorm and RoPE + append shortcuts; on the CPU each concatenated product is
    the modules' own, so its greedy tokens equal transformers' generate on the same model."""
    pytest.importorskip("quant")
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_8BIT_DECODE", "1")
    m, x = tiny(kind), ids()
    pm = patched(m, precision=precision)
    dec = decoder_for(pm, batch_size=2, max_len=24)
    f = dec._layers[0]
    assert dec._q8 and dec._rms and dec._rope_append and f.qkv_s is not None and f.gate_up_s is not None
    q = pm.model.layers[0].self_attn.q_proj
    assert q.weight.untyped_storage().data_ptr() == f.qkv_w.untyped_storage().data_ptr()
    assert q.weight_scale.untyped_storage().data_ptr() == f.qkv_s.untyped_storage().data_ptr()
    assert torch.equal(dec.generate(x, 8), hf_generate(pm, x, 8))
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_8BIT_DECODE", "0")
    off = decoder_for(pm, batch_size=2, max_len=24)
    assert not off._q8 and off._layers[0].qkv_w is None


def test_quantized_prefill_fusions_keep_logits(monkeypatch):
    """The prefill switches on an 8-bit model: RMSNorm and RoPE fuse, SwiGLU runs its two
    8-bit GEMMs and then ops.silu_mul; the logits equal the unfused patched model's."""
    pytest.importorskip("quant")
    from inference.patch_llama import set_prefill_fusions

    m, x = tiny("qwen2"), ids()
    pm = patched(m, precision="fp8")
    with torch.no_grad():
        base = pm(x).logits
        set_prefill_fusions(pm, rmsnorm=True, rope=True, swiglu=True)
        assert all(layer.gate_up is None for layer in pm.model.layers)  # 8-bit gate / up: two GEMMs
        close(pm(x).logits, base)


def test_fp8_precision_runs_long_prefills_in_fp8_attention(monkeypatch):
    """Under precision="fp8" with attention="cute", causal bf16 prefills from
    ops.FP8_ATTENTION_MIN_SEQLEN tokens (lowered here) run ops.flash_attn_fp8_from16, shorter
    ones flash_attn; CUTE_KERNELS_FP8_ATTENTION=0 keeps flash_attn. Against the bf16-attention
    fp8 model, the logits move by at most twice what the fp8 GEMMs moved them from the bf16
    model's (this tiny random model amplifies any rounding: both are tens of percent)."""
    pytest.importorskip("quant")
    m = tiny("llama", hidden_size=256, num_attention_heads=4, num_key_value_heads=2).to(torch.bfloat16)
    calls = {"fp8": 0, "bf16": 0}
    real_fp8, real_bf16 = ops.flash_attn_fp8_from16_ref, ops.flash_attn_ref

    def count(kind, real):
        def fn(*a, **kw):
            calls[kind] += 1
            return real(*a, **kw)
        return fn

    monkeypatch.setattr(ops, "flash_attn_fp8_from16_ref", count("fp8", real_fp8))
    monkeypatch.setattr(ops, "flash_attn_ref", count("bf16", real_bf16))
    monkeypatch.setattr(ops, "FP8_ATTENTION_MIN_SEQLEN", {64: 10})
    L, x = m.config.num_hidden_layers, ids(seq=12)
    monkeypatch.setenv("CUTE_KERNELS_FP8_ATTENTION", "0")
    off = patched(m, precision="fp8", attention="cute")
    monkeypatch.delenv("CUTE_KERNELS_FP8_ATTENTION")
    pm = patched(m, precision="fp8", attention="cute")
    assert all(layer.self_attn.fp8_attention for layer in pm.model.layers) and pm.cute_patch["fp8_attention"]
    assert not off.cute_patch["fp8_attention"]
    assert not any(getattr(layer.self_attn, "fp8_attention", False) for layer in off.model.layers)
    with torch.no_grad():
        base = off(x).logits.float()
        assert calls == {"fp8": 0, "bf16": L}
        out = pm(x).logits.float()
        assert calls == {"fp8": L, "bf16": L}
        pm(ids(seq=8))
        assert calls == {"fp8": L, "bf16": 2 * L}  # below the threshold
        b16 = patched(m, attention="cute")(x).logits.float()
    assert 0 < (out - base).abs().max().item() <= 2 * (base - b16).abs().max().item()
    # The static decoder's own prefill takes the same path (its bf16 decode steps round apart
    # from transformers' after a few tokens; the prefill's first tokens agree).
    dec = decoder_for(pm, batch_size=2, max_len=24)
    before = calls["fp8"]
    assert torch.equal(dec.generate(x, 2), hf_generate(pm, x, 2)) and calls["fp8"] == before + 2 * L


def test_static_decoder_says_it_runs_gpt2_only():
    with pytest.raises(ValueError, match="LlamaStaticDecoder"):
        StaticDecoder(tiny("llama"), batch_size=1, max_len=16)
    with pytest.raises(ValueError, match="not gpt2"):
        from transformers import GPT2Config, GPT2LMHeadModel

        LlamaStaticDecoder(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)), batch_size=1,
                           max_len=8)
    dec = EagerDecoder(tiny("llama"), batch_size=2, max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        dec.generate(ids(seq=10), 10)
    with pytest.raises(ValueError, match="batch"):
        dec.generate(ids(batch=3, seq=4), 4)
    with pytest.raises(ValueError, match="positions"):
        EagerDecoder(tiny("llama"), batch_size=1, max_len=10_000)


# --------------------------------------------------------------------------- adapter


@pytest.mark.parametrize("tie", [False, True])
def test_llama_adapter(tie):
    m = tiny("qwen2", tie_word_embeddings=tie)
    ad = adapter_for(m)
    cfg = m.config
    assert isinstance(ad, LlamaAdapter) and ad.tied_head == tie and ad.position_embedding is None
    assert (ad.n_layers, ad.hidden, ad.n_heads, ad.n_kv_heads, ad.head_dim, ad.mlp_hidden, ad.vocab) == (
        2, 64, 4, 2, 16, 128, VOCAB)
    # every Linear weight once, the head too when it is tied (a GEMM over the embedding)
    linears = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert ad.matmul_params() == linears
    e, kv = cfg.hidden_size, 2 * 2 * 16
    assert ad.matmul_params() == 2 * (e * (e + kv) + e * e + 3 * e * 128) + VOCAB * e
    layer = ad.layers()[0]
    attn = m.model.layers[0].self_attn
    assert layer.qkv is None and layer.qkv_projections == (attn.q_proj, attn.k_proj, attn.v_proj)
    assert layer.mlp_gate is m.model.layers[0].mlp.gate_proj and layer.mlp_in is m.model.layers[0].mlp.up_proj
    assert layer.attn_scale == 16 ** -0.5
    x = ids()
    torch.testing.assert_close(ad.embed(x, torch.arange(x.shape[1])), m.model.embed_tokens(x))
    from tests.test_inference import tiny_gpt2

    gpt2_layer = adapter_for(tiny_gpt2()).layers()[0]
    assert len(gpt2_layer.qkv_projections) == 1 and gpt2_layer.mlp_gate is None


def test_bench_flops_count_gqa():
    from inference import bench

    ad = adapter_for(tiny("llama"))
    assert bench.prefill_flops(ad, 2, 10) == 2 * 2 * 10 * ad.matmul_params() + 2 * 2 * 2 * 100 * 4 * 16


# --------------------------------------------------------------------------- published configs


EXPECTED = {  # H, I, L, Hq, Hkv, D, V, theta, rope_type, factor, tie, sliding window, eps, max_pos
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, 5e5, "llama3", 32.0, True, None, 1e-5, 131072),
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128, 128256, 5e5, "default", None, False, None, 1e-5, 8192),
    "llama-3-70b": (8192, 28672, 80, 64, 8, 128, 128256, 5e5, "default", None, False, None, 1e-5, 8192),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256, 5e5, "llama3", 8.0, False, None, 1e-5, 131072),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, 152064, 1e6, "default", None, False, None, 1e-6, 131072),
    "mistral-7b": (4096, 14336, 32, 32, 8, 128, 32000, 1e4, "default", None, False, 4096, 1e-5, 32768),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_published_configs(name):
    from inference.models import LLAMA_CONFIGS, llama_config

    assert set(LLAMA_CONFIGS) == set(EXPECTED)
    cfg = llama_config(name)
    rope = cfg.rope_parameters
    got = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
           cfg.num_key_value_heads, None, cfg.vocab_size, rope["rope_theta"], rope["rope_type"], rope.get("factor"),
           cfg.tie_word_embeddings, cfg.sliding_window if cfg.model_type != "llama" else None, cfg.rms_norm_eps,
           cfg.max_position_embeddings)
    with torch.device("meta"):  # the real module tree, no memory
        model = getattr(transformers, {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                       "mistral": "MistralForCausalLM"}[cfg.model_type])(cfg)
    ad = adapter_for(model)
    got = got[:5] + (ad.head_dim,) + got[6:]
    assert got == EXPECTED[name]
    assert ad.tied_head == EXPECTED[name][10]
    if rope["rope_type"] == "llama3":
        assert (rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]) == (
            1.0, 4.0, 8192)
    assert ad.matmul_params() == sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_published_configs_agree_with_the_tuning_table(name):
    """N and K of every GEMM patch_model runs appear in cute_kernels/tuning/models.py's table,
    which fuses q/k/v and gate/up: the separate projections are its slices."""
    from cute_kernels.tuning.models import MODELS
    from inference.models import llama_config

    if name not in MODELS:
        pytest.skip(f"{name} is not in the tuning table")
    shape, cfg = MODELS[name], llama_config(name)
    with torch.device("meta"):
        model = getattr(transformers, {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                       "mistral": "MistralForCausalLM"}[cfg.model_type])(cfg)
    layer = adapter_for(model).layers()[0]
    nk = {n: tuple(getattr(layer, n).weight.shape) for n in ("q_proj", "k_proj", "v_proj", "out_proj", "mlp_gate",
                                                            "mlp_in", "mlp_out")}
    table = {lin.name: (lin.n, lin.k) for lin in shape.linears()}
    assert nk["q_proj"][0] + nk["k_proj"][0] + nk["v_proj"][0] == table["qkv"][0]
    assert nk["q_proj"][1] == nk["k_proj"][1] == table["qkv"][1]
    assert nk["out_proj"] == table["o"] and nk["mlp_out"] == table["down"]
    assert (nk["mlp_gate"][0] + nk["mlp_in"][0], nk["mlp_gate"][1]) == table["gate_up"]
    assert tuple(model.lm_head.weight.shape) == table["lm_head"]
    assert shape.qkv_bias == (cfg.model_type == "qwen2")


# --------------------------------------------------------------------------- isolation


_UNTOUCHED_SCRIPT = """
import sys
import torch
from transformers import MistralConfig, MistralForCausalLM

torch.manual_seed(0)
cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=300, max_position_embeddings=64, sliding_window=5)
model = MistralForCausalLM(cfg).eval()
x = torch.randint(0, 300, (2, 12))
mask = torch.ones(2, 12, dtype=torch.long)
mask[1, :3] = 0
if sys.argv[1] == "patch":  # another model, built from the same config object, patched first
    from inference.patch import patch_model

    impl = model.config._attn_implementation
    other = patch_model(MistralForCausalLM(cfg).eval(), attention="cute", backend="reference")
    assert model.config._attn_implementation == impl, "patching switched another model's attention"
    with torch.no_grad():
        other(x, use_cache=False)
        other.generate(x[:1], max_new_tokens=5, do_sample=False, pad_token_id=0)
with torch.no_grad():
    outs = [model(x, use_cache=False).logits, model(x).logits, model(x, attention_mask=mask).logits,
            model.generate(x[:1], max_new_tokens=5, do_sample=False, pad_token_id=0),
            model.generate(x[:1], max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="static")]
torch.save(outs, sys.argv[2])
"""


def test_patching_one_model_leaves_another_bit_identical(tmp_path):
    outs = fresh_process_results(_UNTOUCHED_SCRIPT, ("plain", "patch"), tmp_path)
    for a, b in zip(outs["plain"], outs["patch"]):
        assert torch.equal(a, b)


def test_class_names_are_importable():
    """Patched models pickle: the swapped classes live at module level under their names."""
    import pickle

    pm = patched(tiny("mistral"))
    back = pickle.loads(pickle.dumps(pm))
    assert isinstance(back.model.layers[0], CuteMistralDecoderLayer)
    assert CuteLlamaAttention.__module__ == CuteQwen2DecoderLayer.__module__ == "inference.patch_llama"


# --------------------------------------------------------------------------- near-tie rule


def test_near_tie_rule():
    """tests/model_util.greedy_divergences: the reference's own greedy tokens agree; a token
    changed mid-way is the first divergence, acceptable only when the logit gap there is
    below twice the bound; what follows a divergence is not compared."""
    from tests.model_util import greedy_divergences, logit_error_bound

    m = tiny("llama")
    x = ids(batch=2, seq=6)
    ref = hf_generate(m, x, 12)
    bound = logit_error_bound(m, copy.deepcopy(m).double(), torch.cat([x, ref], 1))
    assert bool((bound > 0).all()) and float(bound.max()) < 1e-3
    assert [r["first"] for r in greedy_divergences(m, x, ref, bound)] == [None, None]
    bad = ref.clone()
    bad[1, 5] = (bad[1, 5] + 1) % VOCAB
    bad[1, 6:] = 0  # after the divergence: not compared
    rows = greedy_divergences(m, x, bad, bound)
    assert rows[0]["ok"] and rows[1]["first"] == 5 and rows[1]["gap"] > 0 and not rows[1]["ok"]
    assert greedy_divergences(m, x, bad, torch.full_like(bound, rows[1]["gap"]))[1]["ok"]


# --------------------------------------------------------------------------- static decoder and its fusions

FUSIONS = {"none": {"CUTE_KERNELS_LLAMA_QKV": "0"}, "default": {},
           "all": {"CUTE_KERNELS_LLAMA_RMS_PROLOGUE": "1", "CUTE_KERNELS_LLAMA_SWIGLU": "1",
                   "CUTE_KERNELS_LLAMA_ROPE_APPEND": "1"}}


@pytest.mark.parametrize("fusions", list(FUSIONS))
@pytest.mark.parametrize("attention", ["sdpa", "cute"])
@pytest.mark.parametrize("kind,kw", [("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 5}),
                                     ("llama", {"tie_word_embeddings": True}),
                                     ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5,
                                                                    "factor": 8.0, "low_freq_factor": 1.0,
                                                                    "high_freq_factor": 4.0,
                                                                    "original_max_position_embeddings": 16}})])
def test_static_decoder_tokens_equal_stock(kind, kw, attention, fusions, monkeypatch):
    """LlamaStaticDecoder on the references, with each set of decode fusions (their reference
    forms: RMSNorm prologue, SwiGLU epilogue, RoPE + append), equals the stock model's greedy
    tokens: Qwen2's biases, a tied head, Mistral's window (5) shorter than prompt + generation,
    Llama-3 rope scaling. The unpatched model runs the same loop on its own modules."""
    for name, value in FUSIONS[fusions].items():
        monkeypatch.setenv(name, value)
    m = tiny(kind, **kw)
    x = ids(batch=2, seq=7)
    ref = hf_generate(m, x, 20)
    assert torch.equal(LlamaStaticDecoder(patched(m, attention=attention), batch_size=2, max_len=30).generate(x, 20),
                       ref)
    if fusions == "default" and attention == "sdpa":
        assert torch.equal(LlamaStaticDecoder(m, batch_size=2, max_len=30).generate(x, 20), ref)


def test_static_decoder_near_tie_rule_bf16():
    """bf16 on the CPU: the static decoder's tokens against the stock bf16 model by the near-tie
    rule (bound: the stock bf16 model against fp32)."""
    from tests.model_util import assert_greedy_agrees, logit_error_bound

    m = tiny("qwen2")
    base = copy.deepcopy(m).to(torch.bfloat16)
    x = ids(batch=4, seq=7)
    out = LlamaStaticDecoder(patched(base, attention="cute"), batch_size=4, max_len=40).generate(x, 32)
    assert_greedy_agrees(base, x, out, logit_error_bound(base, m, torch.cat([x, out], 1)), "qwen2 bf16 cpu")


def test_concatenated_weights_are_the_modules_weights():
    """q/k/v (and their biases) and gate/up become row blocks of one tensor each: the modules
    see the same values, no second copy is held, and a second decoder reuses the blocks."""
    pm = patched(tiny("qwen2"))
    a, mlp = pm.model.layers[0].self_attn, pm.model.layers[0].mlp
    before = [t.clone() for t in (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.q_proj.bias)]
    dec = LlamaStaticDecoder(pm, batch_size=1, max_len=16)
    f = dec._layers[0]
    assert torch.equal(f.qkv_w, torch.cat(before[:3])) and torch.equal(f.qkv_b[:a.q_proj.bias.shape[0]], before[3])
    assert a.k_proj.weight.data_ptr() == f.qkv_w[a.q_proj.weight.shape[0]:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == f.gate_up_w[mlp.gate_proj.weight.shape[0]:].data_ptr()
    again = LlamaStaticDecoder(pm, batch_size=1, max_len=16)._layers[0]
    assert again.qkv_w.data_ptr() == f.qkv_w.data_ptr() and again.gate_up_w.data_ptr() == f.gate_up_w.data_ptr()
    x = ids(batch=1, seq=5)
    assert torch.equal(dec.generate(x, 8), hf_generate(tiny("qwen2"), x, 8))
    w = torch.nn.Parameter(torch.randn(3, 4))
    assert torch.equal(concat_rows([w]), w.data)


def test_fused_op_references_match_transformers():
    """The fused ops' reference forms compute what transformers' modules do, bit for bit in bf16:
    RMSNorm then linear, SwiGLU, RoPE with the cache append."""
    m = tiny("llama").to(torch.bfloat16)
    layer = m.model.layers[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16) * 4 + 1
    norm, attn, mlp = layer.input_layernorm, layer.self_attn, layer.mlp
    y = ops.rms_linear(x, norm.weight, norm.variance_epsilon, attn.q_proj.weight, None, "reference")
    assert torch.equal(ops.rms_norm_ref(x, norm.weight, norm.variance_epsilon), norm(x))
    assert torch.equal(ops.rms_norm(x[None], norm.weight, norm.variance_epsilon, "cute"), norm(x[None]))  # CPU
    torch.testing.assert_close(y, attn.q_proj(norm(x)), rtol=0, atol=0)
    gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    h = norm(x)
    torch.testing.assert_close(ops.rms_swiglu(x, norm.weight, norm.variance_epsilon, gu, "reference"),
                               mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h), rtol=0, atol=0)
    torch.testing.assert_close(ops.rms_swiglu(h, None, 0.0, gu, "reference"),
                               mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h), rtol=0, atol=0)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    Hq, Hkv, D, L = 4, 2, 16, 10
    qkv = torch.randn(3, (Hq + 2 * Hkv) * D, generator=g).to(torch.bfloat16)
    pos = torch.tensor([6])
    cos, sin = m.model.rotary_emb(qkv, torch.arange(L)[None])
    kc, vc = torch.randn(3, Hkv, L, D).to(torch.bfloat16), torch.randn(3, Hkv, L, D).to(torch.bfloat16)
    kc0 = kc.clone()
    q = ops.rope_append(qkv, cos[0], sin[0], pos, kc, vc, Hq, "reference")
    q_hf, k_hf = apply_rotary_pos_emb(qkv[:, :Hq * D].view(3, 1, Hq, D).transpose(1, 2),
                                      qkv[:, Hq * D:(Hq + Hkv) * D].view(3, 1, Hkv, D).transpose(1, 2),
                                      cos[:, 6:7], sin[:, 6:7])
    assert torch.equal(q, q_hf.transpose(1, 2)[:, 0]) and torch.equal(kc[:, :, 6], k_hf[:, :, 0])
    assert torch.equal(vc[:, :, 6], qkv[:, (Hq + Hkv) * D:].view(3, Hkv, D))
    assert torch.equal(kc[:, :, :6], kc0[:, :, :6]) and torch.equal(kc[:, :, 7:], kc0[:, :, 7:])


_FUSED_KERNELS_SCRIPT = """
import torch
from cute_kernels.matmul.gemv import skinny_gemm
from inference import ops
from inference.llama_kernels import rope_append_triton
g = torch.Generator().manual_seed(0)
# bf16 for one row; the interpreter's tl.dot (two or more rows) is wrong for bf16, so fp16 there
for M, N, K, bf in ((1, 24, 96, torch.bfloat16), (3, 40, 80, torch.float16), (1, 2100, 320, torch.bfloat16)):
    def r(*s): return torch.randn(*s, generator=g).to(bf)
    x = r(M, K) * 3 + 0.5
    nw = r(K)
    w = r(N, K) * 0.2
    b = r(N)
    y = skinny_gemm(x, w, b, rms=(nw, 1e-5))
    h = ops.rms_norm_ref(x, nw, 1e-5)
    assert torch.equal(ops.rms_norm_ref(x, nw, 1e-5)[:, :4], h[:, :4])
    ref = (h.float() @ w.float().t() + b.float())
    err = (y.float() - ref).abs().max().item(); lim = 2e-2 * ref.abs().max().item()
    assert err < lim, (M, N, K, err, lim)
    # the prologue's rounding reproduces transformers' normalised row exactly
    yi = skinny_gemm(x, torch.eye(K, dtype=bf), rms=(nw, 1e-5))
    # within one bf16 step (the CPU interpreter's fp32 -> bf16 conversion may truncate; the
    # GPU test checks the rounding itself)
    assert ((yi.float() - h.float()).abs() <= h.float().abs() * 2.0 ** -6 + 1e-6).all()
    wgu = r(2 * N, K) * 0.2
    a = skinny_gemm(x, wgu, rms=(nw, 1e-5), swiglu=True)
    gu = (h.float() @ wgu.float().t()).to(bf)
    ref = ops.swiglu_ref(gu)
    # three roundings, each possibly a truncation on the CPU interpreter: a few bf16 steps
    tol = ref.float().abs() * 2.0 ** -5 + 2e-2 * ref.float().abs().max()
    assert a.shape == (M, N) and bool(((a.float() - ref.float()).abs() <= tol).all())
    a2 = skinny_gemm(h, wgu, swiglu=True)
    assert bool(((a2.float() - ref.float()).abs() <= tol).all())
    # 8-bit weight-only (per-channel scales) with the same prologue and epilogue
    for w8 in (torch.int8, torch.float8_e4m3fn):
        q = (torch.randint(-100, 101, (2 * N, K), generator=g).to(w8) if w8 == torch.int8
             else (torch.randn(2 * N, K, generator=g) * 8).to(w8))
        s8 = torch.rand(2 * N, generator=g) * 0.01 + 1e-3
        wd = q.float() * s8[:, None]
        y = skinny_gemm(x, q[:N], rms=(nw, 1e-5), w_scale=s8[:N].contiguous())
        ref = h.float() @ wd[:N].t()
        assert ((y.float() - ref).abs() <= ref.abs() * 2.0 ** -5 + 2e-2 * ref.abs().max()).all(), (w8, M, N, K)
        a = skinny_gemm(x, q, rms=(nw, 1e-5), swiglu=True, w_scale=s8)
        ref = ops.swiglu_ref((h.float() @ wd.t()).to(bf))
        tol = ref.float().abs() * 2.0 ** -5 + 2e-2 * ref.float().abs().max()
        assert a.shape == (M, N) and bool(((a.float() - ref.float()).abs() <= tol).all()), (w8, M, N, K)
# RoPE + append in the q/k/v GEMV's epilogue (skinny_gemm rope=) against the GEMV + rope_append_ref
for Hq, Hkv, D, K, M, dt, w8 in ((4, 2, 16, 96, 1, torch.bfloat16, None), (4, 2, 32, 320, 3, torch.float16, None),
                                 (8, 2, 64, 2048, 1, torch.bfloat16, torch.float8_e4m3fn)):
    N = (Hq + 2 * Hkv) * D
    x = (torch.randn(M, K, generator=g) * 2).to(dt)
    nw = torch.randn(K, generator=g).to(dt)
    if w8 is None:
        w, s8 = (torch.randn(N, K, generator=g) * K ** -0.5).to(dt), None
    else:
        w, s8 = (torch.randn(N, K, generator=g) * 40).to(w8), torch.rand(N, generator=g) * 1e-3 + 1e-4
    b = torch.randn(N, generator=g).to(dt)
    ang = torch.rand(12, D, generator=g) * 6.3
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    pos = torch.tensor([7])
    kc, vc = torch.randn(M + 1, Hkv, 12, D, generator=g).to(dt), torch.randn(M + 1, Hkv, 12, D, generator=g).to(dt)
    kr, vr = kc.clone(), vc.clone()
    q = skinny_gemm(x, w, b, rms=(nw, 1e-5), w_scale=s8, rope=(cos, sin, pos, kc, vc, Hq))
    qr = ops.rope_append_ref(skinny_gemm(x, w, b, rms=(nw, 1e-5), w_scale=s8), cos, sin, pos, kr, vr, Hq)
    # two steps of the largest value (truncating conversions on the CPU interpreter)
    near = lambda a, c: bool(((a.float() - c.float()).abs() <= 2.0 ** -6 * c.float().abs().max()).all())
    assert q.shape == (M, Hq * D) and near(q, qr.reshape(M, -1)) and near(kc, kr) and near(vc, vr), (Hq, D, M)
    assert torch.equal(kc[:, :, :7], kr[:, :, :7]) and torch.equal(vc[:, :, 8:], vr[:, :, 8:])
bf = torch.bfloat16
for Hq, Hkv, D, M in ((4, 2, 16, 3), (8, 2, 64, 1)):
    L = 12
    qkv = r(M, (Hq + 2 * Hkv) * D)
    ang = torch.rand(L, D, generator=g) * 6.3
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)
    pos = torch.tensor([7])
    kc, vc = r(M + 1, Hkv, L, D), r(M + 1, Hkv, L, D)
    kr, vr = kc.clone(), vc.clone()
    q = rope_append_triton(qkv, cos, sin, pos, kc, vc, Hq)
    qr = ops.rope_append_ref(qkv, cos, sin, pos, kr, vr, Hq)
    # two bf16 steps of the largest operand (truncating conversions on the CPU interpreter)
    close = lambda a, b: bool(((a.float() - b.float()).abs() <= 2.0 ** -6 * qkv.float().abs().max()).all())
    assert close(q, qr) and close(kc, kr) and torch.equal(vc, vr)
from inference.llama_kernels import rms_norm_triton
for M, K in ((3, 96), (2, 5000)):
    x = r(M, K) * 3 + 0.5
    nw = r(K)
    h = ops.rms_norm_ref(x, nw, 1e-6)
    y = rms_norm_triton(x, nw, 1e-6)
    assert bool(((y.float() - h.float()).abs() <= h.float().abs() * 2.0 ** -6 + 1e-6).all())
print("OK")
"""


def test_fused_decode_kernels_interpreted():
    """The Triton kernels behind the fused decode ops (the skinny GEMV's RMSNorm prologue and
    SwiGLU epilogue, rope_append, rms_norm) against their references under TRITON_INTERPRET=1. The
    interpreter may truncate fp32 -> bf16, so this checks the logic within a few bf16 steps;
    the exact roundings are checked on the GPU (tests/test_inference_gpu.py)."""
    from tests.test_gemm_host import _run_interpreted

    _run_interpreted(_FUSED_KERNELS_SCRIPT)


def test_rope_append_compiles_for_sm90():
    """rope_append's Triton kernel through Triton's sm_90 pipeline, with its PDL trigger and wait
    ahead of every load and store."""
    from inference.llama_kernels import _rope_append_kernel as K
    from tests.test_gemm_host import _triton_ptx_sm90

    sig = {"qkv_ptr": "*bf16", "qkv_stride": "i32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "pos_ptr": "*i64",
           "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "c_sb": "i32", "c_sh": "i32", "c_ss": "i32",
           "HQ": "i32", "HKV": "i32"}
    ptx = _triton_ptx_sm90(K, sig, {"HALF": 64, "PDL": True}, num_warps=1, enable_fp_fusion=False)
    assert "fma.rn" not in ptx  # every product rounded on its own, as the torch ops do
    i_wait = ptx.index("griddepcontrol.wait")
    assert ".target sm_90" in ptx and ptx.index("griddepcontrol.launch_dependents") < i_wait
    assert "ld.global" not in ptx[:i_wait] and "st.global" not in ptx[:i_wait]


@pytest.mark.parametrize("has_wpe", [False, True])
def test_next_token_glue_compiles_for_sm90(has_wpe):
    """The decode glue kernel with and without position embeddings (the Llama family has none)
    through Triton's sm_90 pipeline."""
    from inference.next_token import _next_token_kernel as K
    from tests.test_gemm_host import _triton_ptx_sm90

    sig = {"logits_ptr": "*bf16", "l_stride": "i32", "V": "i32", "CH": "i32", "wte_ptr": "*bf16", "wpe_ptr": "*bf16",
           "E": "i32", "h_ptr": "*bf16", "h_stride": "i32", "tok_ptr": "*i64", "out_ptr": "*i64", "out_stride": "i32",
           "pos_ptr": "*i64", "step_ptr": "*i64", "seqlens_ptr": "*i32", "part_v_ptr": "*fp32", "part_i_ptr": "*i32",
           "ticket_ptr": "*i32", "B": "i32"}
    ptx = _triton_ptx_sm90(K, sig, {"CHUNKS": 32, "BLOCK_V": 4096, "BLOCK_E": 2048, "PDL": True, "HAS_WPE": has_wpe},
                           num_warps=4)
    assert ".target sm_90" in ptx and "griddepcontrol.wait" in ptx


def test_rms_norm_compiles_for_sm90():
    """As rms_norm_triton launches it on the GPU."""
    from inference.llama_kernels import _rms_norm_kernel as K
    from tests.test_gemm_host import _triton_ptx_sm90

    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "K": "i32", "stride_x": "i32", "stride_o": "i32",
           "eps": "fp32"}
    ptx = _triton_ptx_sm90(K, sig, {"BLOCK": 4096, "PDL": True, "LIBDEVICE": True}, num_warps=8,
                           enable_fp_fusion=False, enable_reflect_ftz=False)
    i_wait = ptx.index("griddepcontrol.wait")
    assert ".target sm_90" in ptx and "ld.global" not in ptx[:i_wait]
    # torch's roundings: each x * x rounded before the sum, rsqrtf without FTZ, an IEEE mean
    assert "fma.rn" not in ptx and "rsqrt.approx.f32" in ptx and "div.rn.f32" in ptx


def test_weight_bytes_count_concatenated_projections_whole():
    """The static decoder re-points q/k/v and gate/up at blocks of one storage: the bench's
    MBU still counts every weight once."""
    from torch import nn

    from inference.bench import weight_bytes
    from inference.decode_llama import concat_rows

    m = nn.Module()
    m.q, m.k, m.v = (nn.Linear(16, n, bias=False) for n in (32, 8, 8))
    before = weight_bytes(m)
    concat_rows([m.q.weight, m.k.weight, m.v.weight])
    assert weight_bytes(m) == before == 4 * 16 * 48


# --------------------------------------------------------------------------- prefill fusions

PREFILL_SWITCHES = ("CUTE_KERNELS_LLAMA_PREFILL_RMSNORM", "CUTE_KERNELS_LLAMA_PREFILL_ROPE",
                    "CUTE_KERNELS_LLAMA_PREFILL_SWIGLU")


@pytest.mark.parametrize("kind", list(KINDS))
def test_prefill_fusions_run_our_ops_and_keep_logits(kind, monkeypatch):
    """With the three prefill switches on, a bf16 model (reference backend: the fused paths'
    torch forms) runs ops.rms_norm, ops.rope_prefill and ops.swiglu_linear over one [gate; up]
    weight, and its logits equal those with the switches off, with silu * up as a launch of its
    own ("launch") and after two GEMMs ("split"); set_prefill_fusions flips them."""
    from inference import patch_llama

    for name in PREFILL_SWITCHES:
        monkeypatch.setenv(name, "1")
    m = tiny(kind).to(torch.bfloat16)
    pm = patched(m)
    layer = pm.model.layers[0]
    assert layer.input_layernorm.fused and layer.self_attn.fused_rope and layer.fused_swiglu
    w, _ = layer.gate_up
    assert layer.mlp.gate_proj.weight.data_ptr() == w.data_ptr()
    assert layer.mlp.up_proj.weight.data_ptr() == w[layer.mlp.gate_proj.out_features:].data_ptr()
    sd0, sd1 = m.state_dict(), pm.state_dict()
    assert list(sd0) == list(sd1) and all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    calls = {}
    for op in ("rms_norm", "rope_prefill", "silu_mul", "swiglu_linear"):
        real = getattr(ops, op)

        def counted(*a, _real=real, _op=op):
            calls[_op] = calls.get(_op, 0) + 1
            return _real(*a)

        monkeypatch.setattr(ops, op, counted)
    x = ids()
    with torch.no_grad():
        on = pm(x).logits
        n_layers = len(pm.model.layers)
        assert calls == {"rms_norm": 2 * n_layers + 1, "rope_prefill": n_layers, "swiglu_linear": n_layers}
        patch_llama.set_prefill_fusions(pm, rmsnorm=False, rope=False, swiglu=False)
        assert not layer.input_layernorm.fused and layer.gate_up is None
        off = pm(x).logits
        calls.clear()
        patch_llama.set_prefill_fusions(pm, rmsnorm=True, rope=True, swiglu="launch")
        assert layer.gate_up is not None and not layer.swiglu_epilogue
        launch = pm(x).logits
        assert calls["silu_mul"] == n_layers and "swiglu_linear" not in calls
        patch_llama.set_prefill_fusions(pm, rmsnorm=True, rope=True, swiglu="split")
        split = pm(x).logits
    assert torch.equal(on, off) and torch.equal(launch, off) and torch.equal(split, off)


def test_prefill_switches_on_by_default_and_off_by_switch(monkeypatch):
    for name in PREFILL_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    layer = patched(tiny("llama")).model.layers[0]
    assert layer.input_layernorm.fused and layer.self_attn.fused_rope and layer.fused_swiglu
    assert layer.gate_up is not None and layer.swiglu_epilogue
    for name in PREFILL_SWITCHES:
        monkeypatch.setenv(name, "0")
    layer = patched(tiny("llama")).model.layers[0]
    assert not (layer.input_layernorm.fused or layer.self_attn.fused_rope or layer.fused_swiglu)
    assert layer.gate_up is None


def test_prefill_rmsnorm_under_a_tensor_parallel_mixin(monkeypatch):
    """tp.finish_patch mixes SeqParallelNorm in before our RMSNorm class; its super().forward()
    reaches ops.rms_norm."""
    from inference import tp

    monkeypatch.setenv("CUTE_KERNELS_LLAMA_PREFILL_RMSNORM", "1")
    pm = patched(tiny("qwen2").to(torch.bfloat16))
    norm = pm.model.layers[0].input_layernorm
    norm.__class__ = tp._seq_parallel_class(type(norm))
    norm.norm_tp = type("OneRank", (), {"sp_norms": False, "size": 1, "rank": 0, "sp_min_rows": 1, "sp_shape": None})()
    seen = []
    real = ops.rms_norm
    monkeypatch.setattr(ops, "rms_norm", lambda *a: seen.append(a[0].shape) or real(*a))
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    with torch.no_grad():
        y = norm(x)
    assert seen == [x.shape] and torch.equal(y, ops.rms_norm_ref(x, norm.weight, norm.variance_epsilon))


def test_prefill_ops_validate_and_match_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = tiny("llama").to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 5, 4, 16, generator=g).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 2, 5, 16, generator=g).to(torch.bfloat16)
    cos, sin = m.model.rotary_emb(q, torch.arange(5)[None].expand(2, 5))
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    qo, ko = ops.rope_prefill(q, k, cos, sin, "cute")  # CPU: the reference
    assert torch.equal(qo, qr) and torch.equal(ko, kr)
    for bad in ((q, k[:1], cos, sin), (q, k, cos[:, :4], sin[:, :4]), (q, k, cos.float(), sin.float()),
                (q[..., :15], k[..., :15], cos[..., :15], sin[..., :15]), (q[0], k[0], cos, sin)):
        with pytest.raises(ValueError):
            ops.rope_prefill(*bad, "reference")
    gu = torch.randn(3, 2, 20, generator=g).to(torch.bfloat16)
    mlp = m.model.layers[0].mlp
    assert torch.equal(ops.silu_mul(gu[..., :10], gu[..., 10:], "cute"), mlp.act_fn(gu[..., :10]) * gu[..., 10:])
    for bad in ((gu, gu[..., :10]), (gu, gu.half())):
        with pytest.raises(ValueError):
            ops.silu_mul(*bad, "reference")


_PREFILL_KERNELS_SCRIPT = """
import torch
from inference import ops
from inference.llama_kernels import rope_prefill_triton, silu_mul_triton
g = torch.Generator().manual_seed(0)
# fp16 is exact under the interpreter; its fp32 -> bf16 conversion may truncate, so bf16 within bf16 steps
for dt in (torch.float16, torch.bfloat16):
    for B, Hq, Hk, S, D, cb in ((2, 4, 2, 5, 16, 2), (1, 3, 1, 33, 64, 1)):
        q = torch.randn(B, S, Hq, D, generator=g).to(dt).transpose(1, 2)  # the attention's strided view
        k = torch.randn(B, Hk, S, D, generator=g).to(dt)
        ang = torch.rand(cb, S, D, generator=g) * 6.3
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
        qo, ko = rope_prefill_triton(q, k, cos, sin)
        qr, kr = ops.rope_prefill(q, k, cos, sin, "reference")
        assert qo.stride() == q.stride() and ko.stride() == k.stride()
        if dt == torch.float16:
            assert torch.equal(qo, qr) and torch.equal(ko, kr)
        else:
            lim = 2.0 ** -6 * 2 * float(q.float().abs().max())
            assert float((qo.float() - qr.float()).abs().max()) <= lim
            assert float((ko.float() - kr.float()).abs().max()) <= lim
    for M, N in ((3, 40), (2, 5000)):
        gu = (torch.randn(M, 2 * N + 8, generator=g) * 4).to(dt)
        a = silu_mul_triton(gu[:, :N], gu[:, N:2 * N])
        r = ops.silu_mul(gu[:, :N], gu[:, N:2 * N], "reference")
        if dt == torch.float16:  # the interpreter's exp is numpy's, not libdevice's: rare last-bit flips
            assert float((a != r).float().mean()) <= 1e-3
        assert bool(((a.float() - r.float()).abs() <= r.float().abs() * 2.0 ** -5 + 1e-3).all())
print("OK")
"""


def test_prefill_kernels_interpreted():
    """rope_prefill's and silu_mul's Triton kernels against their references under
    TRITON_INTERPRET=1 (strided q, batch-broadcast cos / sin, row-strided gate / up halves)."""
    from tests.test_gemm_host import _run_interpreted

    _run_interpreted(_PREFILL_KERNELS_SCRIPT)


def test_prefill_kernels_compile_for_sm90():
    """Through Triton's sm_90 pipeline as launched: RoPE with no contracted FMA (every product
    rounded on its own), silu with IEEE division and libdevice's expf (torch's CUDA silu is
    x / (1 + expf(-x)) in fp32)."""
    from inference.llama_kernels import _rope_prefill_kernel, _silu_mul_kernel
    from tests.test_gemm_host import _triton_ptx_sm90

    names = ("S", "HQ", "HK", "sq_b", "sq_h", "sq_s", "sk_b", "sk_h", "sk_s", "sqo_b", "sqo_h", "sqo_s", "sko_b",
             "sko_h", "sko_s", "sc_b", "sc_s")
    sig = {**{p: "*bf16" for p in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr", "sin_ptr")},
           **{n: "i32" for n in names}}
    ptx = _triton_ptx_sm90(_rope_prefill_kernel, sig, {"HALF": 64, "BLOCK_S": 16}, num_warps=4,
                           enable_fp_fusion=False)
    assert ".target sm_90" in ptx and "fma.rn" not in ptx
    sig = {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16", "N": "i32", "s_g": "i32", "s_u": "i32", "s_o": "i32"}
    ptx = _triton_ptx_sm90(_silu_mul_kernel, sig, {"BLOCK": 2048, "LIBDEVICE": True}, num_warps=4,
                           enable_fp_fusion=False, enable_reflect_ftz=False)
    assert "div.rn.f32" in ptx and "div.full" not in ptx and "div.approx" not in ptx
    # mul.rn.bf16 (LLVM's narrowing of silu * up) is fine: the product of two bf16 values is exact
    # in fp32, so one rounding to bf16 is what torch's fp32 multiply and cast give.
    assert "fma.rn" not in ptx.replace("fma.rn.f32", "")  # libdevice's expf has its own fp32 FMAs, as CUDA's
