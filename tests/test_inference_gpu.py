"""GPU tests of the patched model on Hopper (skipped elsewhere by tests/conftest.py's `gpu` marker).

Accuracy rule ("2x rule"): against an fp32 run of the same weights, the patched
bf16 model's error may be at most twice the stock bf16 model's error (plus a
small floor). Weights are random (no hub access): GPT-2 sizes from
inference.models, with wte scaled up so greedy choices have real margins.
"""

import copy

import pytest
import torch

from tests.model_util import assert_within_2x_error

pytestmark = pytest.mark.gpu

ATTENTIONS = ["sdpa", "cute"]


def random_gpt2(name_or_cfg, peaky=True):
    from transformers import GPT2Config, GPT2LMHeadModel

    from inference.models import gpt2_config

    cfg = gpt2_config(name_or_cfg) if isinstance(name_or_cfg, str) else GPT2Config(**name_or_cfg)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg).eval()
    if peaky:
        with torch.no_grad():
            model.transformer.wte.weight.mul_(5.0)
    return model


SMALL = {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 50257, "n_positions": 1024}


def _patch(model, attention="sdpa", precision="bf16", **kw):
    from inference.ops import cute_attention_available
    from inference.patch import patch_model

    if attention == "cute" and not cute_attention_available()[0]:
        pytest.skip("cute_kernels.flash_attn is not available yet")
    return patch_model(model, precision=precision, attention=attention, backend="cute", **kw)


def _ids(batch, seq, vocab=50257, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium"])
@torch.no_grad()
def test_patched_logits_2x_rule(name, attention):
    fp32 = random_gpt2(name, peaky=False)
    x = _ids(2, 128)
    ref = fp32(x).logits.float()
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), attention)
    del fp32
    assert_within_2x_error(ours(x).logits, base(x).logits, ref)


@pytest.mark.parametrize("attention", ATTENTIONS)
@torch.no_grad()
def test_generate_greedy_agreement(attention):
    from inference.decode import hf_generate

    base = random_gpt2("gpt2").to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), attention)
    x = _ids(2, 32)
    a, b = hf_generate(base, x, 32), hf_generate(ours, x, 32)
    assert float((a == b).float().mean()) >= 0.9
    full = torch.cat([x, a], 1)  # teacher-forced on the stock continuation
    top_a = base(full).logits[:, 31:-1].argmax(-1)
    top_b = ours(full).logits[:, 31:-1].argmax(-1)
    assert float((top_a == top_b).float().mean()) >= 0.95


@torch.no_grad()
def test_static_cache_compiled_generate():
    """transformers compiles the decode step (reduce-overhead) around our custom ops."""
    from inference.decode import hf_generate

    ours = _patch(random_gpt2(SMALL).to(torch.bfloat16))
    x = _ids(2, 16)
    dynamic = hf_generate(ours, x, 24, cache="dynamic")
    static = hf_generate(ours, x, 24, cache="static")  # auto-compiled on CUDA
    static2 = hf_generate(ours, x, 24, cache="static")  # replays the compiled graph
    assert torch.equal(static, static2)
    assert float((static == dynamic).float().mean()) >= 0.9


@pytest.mark.parametrize("compile", [False, True])
@torch.no_grad()
def test_decode_loop_cuda_graph(compile):
    from inference.decode import StaticDecoder, hf_generate

    ours = _patch(random_gpt2(SMALL).to(torch.bfloat16))
    x = _ids(4, 20)
    graphed = StaticDecoder(ours, batch_size=4, max_len=64, compile=compile)
    assert graphed.cuda_graph
    eager = StaticDecoder(ours, batch_size=4, max_len=64, cuda_graph=False)
    out = graphed.generate(x, 40)
    assert graphed._graph is not None
    assert torch.equal(out, graphed.generate(x, 40))  # replays are repeatable
    if not compile:  # same kernels, same order: graph replay is bit-identical to eager
        assert torch.equal(out, eager.generate(x, 40))
    assert float((out == hf_generate(ours, x, 40)).float().mean()) >= 0.9
    # capture mid-generation with no spare cache rows (prompt 20 + 2 tokens = max_len 22)
    tight = StaticDecoder(ours, batch_size=4, max_len=22, compile=compile)
    assert torch.equal(tight.generate(x, 2), out[:, :2])
    assert torch.equal(tight.generate(x, 1), out[:, :1])


@torch.no_grad()
def test_next_token_glue_matches_torch():
    """The one-launch decode glue equals its torch reference: first maximal index on ties,
    bf16 embedding sum, lengths, counters moved on once per launch (ticket left at 0)."""
    from inference.next_token import next_token, next_token_buffers, next_token_reference

    B, V, E, P = 3, 50257, 1600, 1024
    wte = torch.randn(V, E, device="cuda", dtype=torch.bfloat16)
    wpe = torch.randn(P, E, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(B, 50264, device="cuda", dtype=torch.bfloat16)
    logits[0, 7], logits[0, 40000] = 30.0, 30.0  # a tie: the first index wins
    logits[2, V - 1] = 31.0  # the last real column
    logits[1, V:] = 99.0  # row padding past the vocabulary is never chosen
    logits[2, 1571 * 5 + 3], logits[2, 1571 * 9] = 29.0, 29.0  # (row 2's max is 31 at V - 1)
    states = []
    for fn in (next_token, next_token_reference):
        tok = torch.zeros(B, 1, dtype=torch.long, device="cuda")
        out = torch.zeros(B, 64, dtype=torch.long, device="cuda")
        pos, step = torch.tensor([500], device="cuda"), torch.tensor([9], device="cuda")
        h = torch.empty(B, 1, E, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.empty(B, dtype=torch.int32, device="cuda")
        args = [logits, wte, wpe, tok, out, pos, step, h, seqlens]
        buffers = next_token_buffers(B, "cuda")
        for _ in range(2):  # twice: the counters move on by one per launch
            fn(*args, buffers) if fn is next_token else fn(*args)
        states.append(args[3:] + ([buffers[2]] if fn is next_token else []))
    ours, ref = states
    assert ours[0][:, 0].tolist() == [7, logits[1, :V].float().argmax().item(), V - 1]
    for a, b in zip(ours[:6], ref):
        assert torch.equal(a, b)
    assert not ours[-1].any()  # every ticket back at 0


def _check_quantized(base, x, precision: str) -> None:
    """The 8-bit patch of bf16 `base` within 10% (relative norm) of its logits, and its static
    decoder (decoders.decoder_for: one CUDA graph per step) generating 16 tokens."""
    from inference.decoders import decoder_for

    ref = base(x).logits.float()
    ours = _patch(copy.deepcopy(base), precision=precision,
                  calibration=[x] if precision == "int8-smoothquant" else None)
    out = ours(x).logits.float()
    assert torch.isfinite(out).all()
    assert float((out - ref).norm() / ref.norm()) < 0.1
    tokens = decoder_for(ours, batch_size=2, max_len=96).generate(x, 16)
    assert tokens.shape == (2, 16)


@pytest.mark.parametrize("precision", ["fp8", "int8", "int8-smoothquant"])
@torch.no_grad()
def test_quantized_patch_runs(precision):
    _check_quantized(random_gpt2(SMALL).to(torch.bfloat16), _ids(2, 64), precision)


def test_tensorrt_prefill(tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    from inference import tensorrt as trt_path

    base = random_gpt2(SMALL).to(torch.bfloat16)
    x = _ids(2, 64)
    path = trt_path.export_onnx(base, tmp_path / "m.onnx", x, dynamic=False)
    runner = trt_path.TRTRunner(trt_path.build_engine(path, min_shape=tuple(x.shape), opt_shape=tuple(x.shape),
                                                      max_shape=tuple(x.shape)))
    with torch.no_grad():
        ref = base(x).logits.float()
    out = runner(x).float()
    torch.cuda.synchronize()
    assert float((out - ref).norm() / ref.norm()) < 0.02


def test_tensorrt_decode_engine(tmp_path):
    """The static-cache decode engine (tensorrt.StaticCacheStep built by TensorRT) through
    DecodeEngine: greedy tokens agree with Hugging Face's generate, replays repeat."""
    pytest.importorskip("tensorrt", reason="TensorRT is not installed")
    from inference import tensorrt as trt_path
    from inference.decode import hf_generate

    base = random_gpt2(SMALL).to(torch.bfloat16)
    x = _ids(1, 16)
    S, gen = x.shape[1], 24
    with torch.no_grad():
        out = base(x, use_cache=True)
    k, v = trt_path.static_cache_from_past(out.past_key_values, S + gen)
    path = trt_path.export_decode_onnx(base, tmp_path / "decode.onnx", batch=1, max_len=S + gen)
    eng = trt_path.DecodeEngine(trt_path.TRTRunner(trt_path.build_engine(path, min_shape=None, opt_shape=None,
                                                                         max_shape=None)),
                                k, v, out.logits[:, -1].argmax(-1), S)
    toks = []
    for _ in range(2):
        eng.prefill()
        steps = [eng.tok.clone()]
        for _ in range(gen - 2):
            eng.decode(1)
            steps.append(eng.tok.clone())
        toks.append(torch.cat(steps, 1))
    assert torch.equal(toks[0], toks[1])
    want = hf_generate(base, x, gen - 1)
    assert float((toks[0] == want).float().mean()) >= 0.9


@pytest.mark.parametrize("wdtype", [torch.float8_e4m3fn, torch.int8])
@torch.no_grad()
def test_ln_linear_weight_only_op(wdtype):
    """The decode loop's fused LayerNorm + 8-bit weight-only linear against its reference."""
    from inference import ops

    torch.manual_seed(0)
    M, K, N = 1, 1600, 4800
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 3 + 10
    g, b = (torch.randn(K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = (torch.randn(N, K, device="cuda") * 8).clamp(-100, 100).to(wdtype)
    ws = torch.rand(N, device="cuda") / 64
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    xs = torch.rand(K, device="cuda") + 0.5
    out = ops.ln_linear(x, g, b, 1e-5, w, bias, "gelu_tanh", "cute", ws, xs)
    ref = ops.ln_linear(x, g, b, 1e-5, w, bias, "gelu_tanh", "reference", ws, xs)
    assert (out.float() - ref.float()).abs().max().item() <= 1e-2 * ref.float().abs().max().item()


# --------------------------------------------------------------------------- Llama family


def random_llama(kind, *, layers=4, hidden=512, heads=8, kv_heads=2, vocab=32000, **kw):
    """A small random Llama-family model (head dim 64, GQA 4) in fp32 on the GPU, wte scaled up."""
    import transformers

    cfg_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "mistral": ("MistralConfig", "MistralForCausalLM")}[kind]
    cfg = getattr(transformers, cfg_cls)(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                         max_position_embeddings=1024, **kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(5.0)
    return model


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@torch.no_grad()
def test_llama_family_logits_2x_rule(kind, attention):
    """Mistral's window (64) is shorter than the 128-token prompt: explicit masks on our path."""
    fp32 = random_llama(kind, **({"sliding_window": 64} if kind == "mistral" else {}))
    x = _ids(2, 128, vocab=32000)
    ref = fp32(x).logits.float()
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), attention)
    del fp32
    assert_within_2x_error(ours(x).logits, base(x).logits, ref)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@torch.no_grad()
def test_llama_family_greedy_agreement(kind, attention, batch):
    """40 greedy tokens of the patched bf16 model, through decoder_for (the static CUDA-graph
    decoder) and (batch 4) through transformers' generate with a static cache, equal the stock bf16
    model's teacher-forced argmax up to the first near tie (tests/model_util.greedy_divergences:
    the bound is the stock bf16 model's max logit error against fp32 on the same tokens).
    Mistral's window (48) is shorter than prompt + generation, so decode masks keys."""
    from inference.decode import hf_generate
    from inference.decoders import decoder_for
    from tests.model_util import assert_greedy_agrees, logit_error_bound

    fp32 = random_llama(kind, **({"sliding_window": 48} if kind == "mistral" else {}))
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), attention)
    x, n = _ids(batch, 32, vocab=32000), 40
    outs = {"decoder_for": decoder_for(ours, batch_size=batch, max_len=x.shape[1] + n).generate(x, n)}
    if batch == 4:  # transformers compiles its static-cache decode step on CUDA (slow): batch 4 only
        outs["hf_generate static"] = hf_generate(ours, x, n, cache="static")
    for what, tokens in outs.items():
        bound = logit_error_bound(base, fp32, torch.cat([x, tokens], 1))
        rows = assert_greedy_agrees(base, x, tokens, bound, f"{kind}/{attention}/b{batch} {what}")
        print(what, rows)


@pytest.mark.parametrize("precision", ["fp8", "fp8-block", "int8", "int8-smoothquant"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@torch.no_grad()
def test_llama_family_quantized_patch_runs(kind, precision):
    """8-bit projections (quant's modules on our 8-bit GEMMs) within the GPT-2 tests' tolerance."""
    _check_quantized(random_llama(kind).to(torch.bfloat16), _ids(2, 64, vocab=32000), precision)


@pytest.mark.parametrize("swiglu", ["0", "1"])
@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@torch.no_grad()
def test_llama_family_8bit_decode_shortcuts(kind, precision, swiglu, monkeypatch):
    """CUTE_KERNELS_LLAMA_8BIT_DECODE on the GPU: one weight-only GEMV over the concatenated
    8-bit q/k/v (gate/up) and their scales, with the RMSNorm in its prologue (and the SwiGLU
    epilogue), gives each block what the norm and the modules' own weight-only GEMVs give it,
    and the decoder's greedy tokens are the unfused decoder's."""
    from cute_kernels.matmul.gemv import skinny_gemm, weight_only_gemv
    from inference import ops
    from inference.decoders import decoder_for

    pm = _patch(random_llama(kind).to(torch.bfloat16), "cute", precision=precision)
    x = _ids(2, 32, vocab=32000)
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_8BIT_DECODE", "0")
    want = decoder_for(pm, batch_size=2, max_len=48).generate(x, 16)
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_8BIT_DECODE", "1")
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_SWIGLU", swiglu)
    dec = decoder_for(pm, batch_size=2, max_len=48)
    assert dec._q8 and dec._swiglu == (swiglu == "1")
    f, layer = dec._layers[0], pm.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    h = torch.randn(1, f.qkv_w.shape[1], device="cuda", dtype=torch.bfloat16) * 3
    cat = weight_only_gemv(h, f.qkv_w, f.qkv_s, f.qkv_b)
    parts = torch.cat([p(h) for p in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
    assert float((cat.float() - parts.float()).abs().max()) <= 2e-2 * float(parts.float().abs().max())
    norm = layer.input_layernorm
    hn = ops.rms_norm_ref(h, norm.weight, norm.variance_epsilon)
    fused = skinny_gemm(h, f.qkv_w, f.qkv_b, rms=(norm.weight, float(norm.variance_epsilon)), w_scale=f.qkv_s)
    parts = torch.cat([p(hn) for p in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
    assert float((fused.float() - parts.float()).abs().max()) <= 2e-2 * float(parts.float().abs().max())
    norm = layer.post_attention_layernorm
    hn = ops.rms_norm_ref(h, norm.weight, norm.variance_epsilon)
    a = skinny_gemm(h, f.gate_up_w, rms=(norm.weight, float(norm.variance_epsilon)), swiglu=True, w_scale=f.gate_up_s)
    ref = torch.nn.functional.silu(mlp.gate_proj(hn)) * mlp.up_proj(hn)
    assert float((a.float() - ref.float()).abs().max()) <= 3e-2 * float(ref.float().abs().max())
    assert torch.equal(dec.generate(x, 16), want)


# --------------------------------------------------------------------------- Llama-family decode fusions

LLAMA_FUSIONS = {
    "unfused": {"CUTE_KERNELS_LLAMA_QKV": "0", "CUTE_KERNELS_DECODE_GLUE": "0"},
    "qkv": {},
    "rms_prologue": {"CUTE_KERNELS_LLAMA_RMS_PROLOGUE": "1"},
    "swiglu": {"CUTE_KERNELS_LLAMA_SWIGLU": "1"},
    "rope_append": {"CUTE_KERNELS_LLAMA_ROPE_APPEND": "1"},
    "all": {"CUTE_KERNELS_LLAMA_RMS_PROLOGUE": "1", "CUTE_KERNELS_LLAMA_SWIGLU": "1",
            "CUTE_KERNELS_LLAMA_ROPE_APPEND": "1"},
}


@pytest.mark.parametrize("M", [1, 4])
@pytest.mark.parametrize("K", [2048, 4096])
@torch.no_grad()
def test_llama_rms_prologue_and_swiglu_gemv(M, K):
    """The skinny GEMV's RMSNorm prologue and the one-launch RMSNorm reproduce transformers'
    RMSNorm (both roundings) and,
    with the SwiGLU epilogue, stays within 2x the error of the unfused bf16 torch ops against
    fp32."""
    from cute_kernels.matmul.gemv import skinny_gemm
    from inference import ops

    g = torch.Generator(device="cuda").manual_seed(M + K)
    x = (torch.randn(M, K, device="cuda", generator=g) * 2 + 0.3).bfloat16()
    nw = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).bfloat16()
    h = ops.rms_norm_ref(x, nw, 1e-5)
    eye = torch.eye(K, device="cuda", dtype=torch.bfloat16)
    assert float((skinny_gemm(x, eye, rms=(nw, 1e-5)) != h).float().mean()) < 1e-3  # rsqrt may differ by an ulp
    from inference.llama_kernels import rms_norm_triton

    assert float((rms_norm_triton(x, nw, 1e-5) != h).float().mean()) < 1e-3
    I = 3 * K
    w = (torch.randn(2 * I, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
    bias = torch.randn(2 * I, device="cuda", generator=g).bfloat16()
    ref32 = h.float() @ w.float().t() + bias.float()
    y = skinny_gemm(x, w, bias, rms=(nw, 1e-5))
    e_torch = (torch.nn.functional.linear(h, w, bias).float() - ref32).abs().max()
    assert float((y.float() - ref32).abs().max()) <= 2 * float(e_torch) + 1e-3
    gu32 = h.float() @ w.float().t()
    ref = torch.nn.functional.silu(gu32[:, :I]) * gu32[:, I:]
    e_torch = (ops.swiglu_ref(torch.nn.functional.linear(h, w)).float() - ref).abs().max()
    for a in (skinny_gemm(x, w, rms=(nw, 1e-5), swiglu=True), skinny_gemm(h, w, swiglu=True),
              ops.rms_swiglu(x, nw, 1e-5, w, "cute")):
        assert a.shape == (M, I) and float((a.float() - ref).abs().max()) <= 2 * float(e_torch) + 1e-3


@pytest.mark.parametrize("w8", [None, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("Hq,Hkv,D,K,M", [(32, 8, 128, 4096, 1), (32, 8, 64, 2048, 1), (28, 4, 128, 3584, 4)])
@torch.no_grad()
def test_qkv_gemv_rope_epilogue(w8, Hq, Hkv, D, K, M):
    """RoPE + the K/V append in the q/k/v GEMV's epilogue against the GEMV followed by the
    rope_append launch: q, the appended k and v within one bf16 step of the largest value
    (the GEMV's tile width may differ, and with it the order of its fp32 sums), and nothing else
    of the caches touched."""
    from cute_kernels.matmul.gemv import skinny_gemm
    from inference.llama_kernels import rope_append_triton

    g = torch.Generator(device="cuda").manual_seed(Hq + D + K)
    N = (Hq + 2 * Hkv) * D
    x = (torch.randn(M, K, device="cuda", generator=g) * 2).bfloat16()
    nw = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).bfloat16()
    w = torch.randn(N, K, device="cuda", generator=g) * K ** -0.5
    s8 = None
    if w8 is not None:
        s8 = w.abs().amax(1) / 448.0
        w = (w / s8[:, None]).to(w8)
    else:
        w = w.bfloat16()
    b = torch.randn(N, device="cuda", generator=g).bfloat16()
    L = 64
    ang = torch.rand(L, D, device="cuda", generator=g) * 6.3
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    pos = torch.tensor([37], device="cuda")
    kc = torch.randn(M + 1, Hkv, L, D, device="cuda", generator=g).bfloat16()
    vc = torch.randn(M + 1, Hkv, L, D, device="cuda", generator=g).bfloat16()
    kr, vr = kc.clone(), vc.clone()
    q = skinny_gemm(x, w, b, rms=(nw, 1e-5), w_scale=s8, rope=(cos, sin, pos, kc, vc, Hq))
    qkv = skinny_gemm(x, w, b, rms=(nw, 1e-5), w_scale=s8)
    qr = rope_append_triton(qkv, cos, sin, pos, kr, vr, Hq)
    for a, r in ((q, qr.reshape(M, -1)), (kc[:, :, 37], kr[:, :, 37]), (vc[:, :, 37], vr[:, :, 37])):
        assert float((a.float() - r.float()).abs().max()) <= 2.0 ** -7 * float(r.float().abs().max())
    assert torch.equal(kc[:, :, :37], kr[:, :, :37]) and torch.equal(vc[:, :, 38:], vr[:, :, 38:])


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@torch.no_grad()
def test_llama_decode_qkv_rope_tokens(kind, precision, monkeypatch):
    """The decoder with RoPE + append in the q/k/v GEMV's epilogue gives the greedy tokens of
    the decoder with the separate rope_append launch."""
    from inference.decoders import decoder_for

    pm = _patch(random_llama(kind).to(torch.bfloat16), "cute", precision=precision)
    x = _ids(2, 32, vocab=32000)
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_QKV_ROPE", "0")
    want = decoder_for(pm, batch_size=2, max_len=48).generate(x, 16)
    monkeypatch.setenv("CUTE_KERNELS_LLAMA_QKV_ROPE", "1")
    dec = decoder_for(pm, batch_size=2, max_len=48)
    assert dec._qkv_rope
    assert torch.equal(dec.generate(x, 16), want)


@pytest.mark.parametrize("wdt", [torch.float8_e4m3fn, torch.int8], ids=["e4m3", "int8"])
@pytest.mark.parametrize("N,K,kind", [(6144, 4096, "rms"), (3072, 2048, "rms"), (2048, 4096, "rms_swiglu"),
                                      (4096, 4096, "residual"), (2048, 2048, "residual"), (2048, 8192, "residual")])
@torch.no_grad()
def test_long_row_8bit_gemv(wdt, N, K, kind):
    """The one-row weight-only 8-bit GEMV at the Llama family's row lengths (the Triton kernel's
    long-row picks), with the decode step's prologue / epilogues, within 2x the error of torch's
    bf16 ops on the dequantized weights against fp32."""
    from cute_kernels.matmul.gemv import skinny_gemm
    from inference import ops

    g = torch.Generator(device="cuda").manual_seed(N + K)
    rows = 2 * N if kind == "rms_swiglu" else N
    w = torch.randn(rows, K, device="cuda", generator=g) * K ** -0.5
    qmax = 127.0 if wdt == torch.int8 else 448.0
    scale = w.abs().amax(1) / qmax
    wq = (w / scale[:, None]).round().clamp(-127, 127) if wdt == torch.int8 else w / scale[:, None]
    wq = wq.to(wdt)
    wd = wq.float() * scale[:, None]
    x = (torch.randn(1, K, device="cuda", generator=g) * 2 + 0.3).bfloat16()
    if kind == "residual":
        res = torch.randn(1, N, device="cuda", generator=g).bfloat16()
        y = skinny_gemm(x, wq, residual=res, w_scale=scale)
        ref = x.float() @ wd.t() + res.float()
        base = torch.nn.functional.linear(x, wd.bfloat16()) + res
    else:
        nw = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).bfloat16()
        h = ops.rms_norm_ref(x, nw, 1e-5)
        y = skinny_gemm(x, wq, rms=(nw, 1e-5), swiglu=kind == "rms_swiglu", w_scale=scale)
        ref = h.float() @ wd.t()
        base = torch.nn.functional.linear(h, wd.bfloat16())
        if kind == "rms_swiglu":
            ref = torch.nn.functional.silu(ref[:, :N]) * ref[:, N:]
            base = ops.swiglu_ref(base)
    assert y.shape == (1, N)
    e_base = float((base.float() - ref).abs().max())
    assert float((y.float() - ref).abs().max()) <= 2 * e_base + 1e-3 * float(ref.abs().max())


@pytest.mark.parametrize("D,Hq,Hkv,M", [(64, 32, 8, 1), (128, 28, 4, 4)])
@torch.no_grad()
def test_llama_rope_append_kernel_is_exact(D, Hq, Hkv, M):
    """rope_append's kernel equals its reference (transformers' roundings) bit for bit, and
    touches only row pos of the caches."""
    from inference import ops
    from inference.llama_kernels import rope_append_triton

    L = 64
    g = torch.Generator(device="cuda").manual_seed(D)
    qkv = torch.randn(M, (Hq + 2 * Hkv) * D, device="cuda", generator=g).bfloat16()
    ang = torch.rand(L, D, device="cuda", generator=g) * 100
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    kc = torch.randn(M + 1, Hkv, L, D, device="cuda", generator=g).bfloat16()
    vc = torch.randn_like(kc)
    kr, vr = kc.clone(), vc.clone()
    pos = torch.tensor([37], device="cuda")
    q = rope_append_triton(qkv, cos, sin, pos, kc, vc, Hq)
    qr = ops.rope_append_ref(qkv, cos, sin, pos, kr, vr, Hq)
    assert torch.equal(q, qr) and torch.equal(kc, kr) and torch.equal(vc, vr)


@pytest.mark.parametrize("fusions", list(LLAMA_FUSIONS))
@torch.no_grad()
def test_llama_static_decoder_fusions(fusions, monkeypatch):
    """LlamaStaticDecoder with each decode fusion (and none) on our kernels, one CUDA graph per
    token, batch 1 and 4: greedy tokens agree with the stock bf16 model by the near-tie rule
    (Qwen2: q/k/v biases)."""
    from inference.decode_llama import LlamaStaticDecoder
    from tests.model_util import assert_greedy_agrees, logit_error_bound

    for name, value in LLAMA_FUSIONS[fusions].items():
        monkeypatch.setenv(name, value)
    fp32 = random_llama("qwen2")
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), "cute")
    for batch in (1, 4):
        x, n = _ids(batch, 32, vocab=32000, seed=batch), 40
        dec = LlamaStaticDecoder(ours, batch_size=batch, max_len=32 + n)
        tokens = dec.generate(x, n)
        assert dec.cuda_graph and dec._graph is not None
        bound = logit_error_bound(base, fp32, torch.cat([x, tokens], 1))
        assert_greedy_agrees(base, x, tokens, bound, f"{fusions}/b{batch}")


@pytest.mark.parametrize("compile", [False, True])
@torch.no_grad()
def test_llama_static_decoder_unpatched_baseline(compile):
    """The bench's baselines: the unpatched model in the same one-graph loop, eager and under
    torch.compile, agree with transformers' own greedy loop by the near-tie rule (Mistral,
    window 48 shorter than prompt + generation)."""
    from inference.decode_llama import LlamaStaticDecoder
    from tests.model_util import assert_greedy_agrees, logit_error_bound

    fp32 = random_llama("mistral", sliding_window=48)
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    x, n = _ids(2, 32, vocab=32000), 40
    tokens = LlamaStaticDecoder(base, batch_size=2, max_len=32 + n, compile=compile).generate(x, n)
    assert_greedy_agrees(base, x, tokens, logit_error_bound(base, fp32, torch.cat([x, tokens], 1)),
                         f"unpatched compile={compile}")


# --------------------------------------------------------------------------- Llama-family prefill fusions

PREFILL_SWITCHES = ("CUTE_KERNELS_LLAMA_PREFILL_RMSNORM", "CUTE_KERNELS_LLAMA_PREFILL_ROPE",
                    "CUTE_KERNELS_LLAMA_PREFILL_SWIGLU")


@pytest.mark.parametrize("D,Hq,Hk", [(64, 8, 2), (128, 32, 8)])
@torch.no_grad()
def test_llama_prefill_rope_kernel_is_exact(D, Hq, Hk):
    """ops.rope_prefill's kernel equals transformers' apply_rotary_pos_emb bit for bit in bf16
    (q as the attention's transposed view, cos / sin from the model's rotary embedding)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from inference import ops

    B, S = 2, 300
    m = random_llama("llama", layers=1, hidden=Hq * D, heads=Hq, kv_heads=Hk).to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(D)
    q = (torch.randn(B, S, Hq, D, device="cuda", generator=g) * 3).bfloat16().transpose(1, 2)
    k = (torch.randn(B, S, Hk, D, device="cuda", generator=g) * 3).bfloat16().transpose(1, 2)
    pos = torch.arange(S, device="cuda")[None].expand(B, S) + torch.tensor([[0], [500]], device="cuda")
    cos, sin = m.model.rotary_emb(q, pos)
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    qo, ko = ops.rope_prefill(q, k, cos, sin, "cute")
    assert torch.equal(qo, qr) and torch.equal(ko, kr)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@torch.no_grad()
def test_llama_prefill_silu_mul_and_rmsnorm_kernels(dtype):
    """ops.silu_mul's kernel equals F.silu(g) * u bit for bit (on the halves of one [gate | up]
    output, as the concatenated GEMM hands them over); ops.rms_norm's launch equals transformers'
    RMSNorm in all but a few elements (the fp32 sum of squares is reduced in another order) and
    stays within 2x the stock module's error against fp32."""
    import torch.nn.functional as F

    from inference import ops

    g = torch.Generator(device="cuda").manual_seed(0)
    M, N = 1000, 14336
    gu = (torch.randn(M, 2 * N, device="cuda", generator=g) * 3).to(dtype)
    gu[0, :8] = torch.tensor([-100, -90, -20, 0, 20, 90, 100, 1e-3])  # silu's tails
    gate, up = gu[:, :N], gu[:, N:]
    assert torch.equal(ops.silu_mul(gate, up, "cute"), F.silu(gate) * up)
    K = 4096
    x = (torch.randn(3, 700, K, device="cuda", generator=g) * 2 + 0.3).to(dtype)
    w = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).to(dtype)
    ref = ops.rms_norm_ref(x, w, 1e-5)
    y = ops.rms_norm(x, w, 1e-5, "cute")
    assert y.shape == x.shape and float((y != ref).float().mean()) < 1e-3
    x32 = x.float()
    truth = w.float() * x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
    e_ref, e_y = (ref.float() - truth).abs().max(), (y.float() - truth).abs().max()
    assert float(e_y) <= 2 * float(e_ref) + 1e-6


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@torch.no_grad()
def test_llama_prefill_fusions_logits(kind, monkeypatch):
    """The patched bf16 model with the three prefill switches on: its fused ops run, its logits
    meet the 2x rule against fp32 and stay within the bf16 noise of the same model with them
    off (the [gate; up] GEMM may pick another tile config than the two GEMMs; RMSNorm's sum of
    squares is reduced in another order)."""
    from inference import patch_llama

    for name in PREFILL_SWITCHES:
        monkeypatch.setenv(name, "1")
    fp32 = random_llama(kind, **({"sliding_window": 64} if kind == "mistral" else {}))
    x = _ids(2, 128, vocab=32000)
    ref = fp32(x).logits.float()
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = _patch(copy.deepcopy(base), "sdpa")
    del fp32
    layer = ours.model.layers[0]
    assert layer.input_layernorm.fused and layer.self_attn.fused_rope and layer.gate_up is not None
    on = ours(x).logits.float()
    for _ in range(3):  # run to run the same bits (split-K partials add in split order)
        assert torch.equal(ours(x).logits.float(), on)
    patch_llama.set_prefill_fusions(ours, rmsnorm=False, rope=False, swiglu=False)
    off = ours(x).logits.float()
    base_logits = base(x).logits.float()
    assert_within_2x_error(on, base_logits, ref)
    e_base = base_logits - ref
    assert float((on - off).abs().max()) <= 2 * float(e_base.abs().max()) + 1e-3 * float(ref.abs().max())
    # RoPE and silu * mul are exact: the kernels bit for bit against transformers' torch ops
    from inference import ops
    from inference.llama_kernels import rope_prefill_triton, silu_mul_triton

    g = torch.Generator(device="cuda").manual_seed(1)
    q = (torch.randn(2, 128, 8, 64, device="cuda", generator=g) * 3).bfloat16().transpose(1, 2)
    k = (torch.randn(2, 128, 2, 64, device="cuda", generator=g) * 3).bfloat16().transpose(1, 2)
    ang = torch.rand(2, 128, 64, device="cuda", generator=g) * 50
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    qo, ko = rope_prefill_triton(q, k, cos, sin)
    assert torch.equal(qo, ops.rope_ref(q, cos[:, None], sin[:, None]))
    assert torch.equal(ko, ops.rope_ref(k, cos[:, None], sin[:, None]))
    gate = (torch.randn(256, 1408, device="cuda", generator=g) * 4).bfloat16()
    up = torch.randn(256, 1408, device="cuda", generator=g).bfloat16()
    assert torch.equal(silu_mul_triton(gate, up), torch.nn.functional.silu(gate) * up)
