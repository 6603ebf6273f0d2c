"""ONNX side of the TensorRT path (TensorRT itself is GPU-only): export and Q/DQ insertion.

The exported graph must compute the PyTorch logits (checked with onnxruntime at
several shapes, since batch and sequence are symbolic), and the Q/DQ-rewritten
graphs must be valid ONNX that still computes nearly the same logits.
"""

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="onnx is a dev dependency (pip install onnx)")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")

from inference import tensorrt as trt_path


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1001, n_positions=128, bos_token_id=0,
                     eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-zero biases (the exporter folds zero ones away), larger weights
        for name, p in model.named_parameters():
            if name.endswith("bias") and ".ln" not in name:
                p.normal_(0, 0.1)
            elif p.dim() == 2:
                p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_gpt2()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    path = trt_path.export_onnx(model, tmp_path_factory.mktemp("onnx") / "gpt2.onnx", ids)
    return model, ids, path


def _ort_session(path, optimize=True):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a dev dependency")
    opts = ort.SessionOptions()
    if not optimize:  # ORT's CPU graph optimizer moves fp8 Q/DQ onto ops it has no fp8 kernel for
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def test_export_matches_pytorch(exported):
    model, _, path = exported
    onnx.checker.check_model(str(path))
    mp = onnx.load(str(path), load_external_data=False)
    assert {o.domain: o.version for o in mp.opset_import}.get("", 0) >= 19
    sess = _ort_session(path)
    for shape in [(2, 16), (1, 5), (3, 40)]:  # symbolic batch and sequence
        x = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(1))
        got = sess.run(None, {"input_ids": x.numpy()})[0]
        with torch.no_grad():
            want = model(x).logits.numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_export_refuses_patched_model(exported, tmp_path):
    import copy

    from inference.patch import patch_model

    model, ids, _ = exported
    with pytest.raises(ValueError, match="unpatched"):
        trt_path.export_onnx(patch_model(copy.deepcopy(model), backend="reference"), tmp_path / "x.onnx", ids)


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_qdq_insertion(exported, tmp_path, precision):
    model, ids, path = exported
    amax = trt_path.calibrate_activations(model, [ids])
    n_gemms = 4 * model.config.n_layer + 1
    assert len(amax) == n_gemms
    out = tmp_path / f"gpt2_{precision}.onnx"
    # every weight GEMM, lm_head included (the exporter folds its transpose into a new constant:
    # found by value, not by name)
    assert trt_path.quantize_onnx(path, out, precision, amax, trt_path.gemm_weights(model)) == n_gemms
    onnx.checker.check_model(str(out), full_check=True)
    mp = onnx.load(str(out), load_external_data=False)
    ops = [n.op_type for n in mp.graph.node]
    assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear") == 2 * n_gemms
    sess = _ort_session(out, optimize=precision == "int8")
    got = torch.from_numpy(sess.run(None, {"input_ids": ids.numpy()})[0])
    with torch.no_grad():
        want = model(ids).logits
    assert float((got - want).norm() / want.norm()) < 0.25  # 8-bit error on a deliberately peaky model


def test_qdq_rejects_unknown_precision(exported):
    _, _, path = exported
    with pytest.raises(ValueError, match="precision"):
        trt_path.insert_qdq(onnx.load(str(path)), "int4", {})


def test_static_cache_step_matches_hf_decode_and_exports(tmp_path):
    """StaticCacheStep (the decode engine's graph) against Hugging Face's own decode with
    past_key_values, garbage past the filled length ignored, ragged positions; then the ONNX
    export of it through onnxruntime."""
    model = tiny_gpt2()
    B, S, Smax = 2, 7, 16
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    nxt = torch.randint(0, model.config.vocab_size, (B, 1), generator=torch.Generator().manual_seed(1))
    step = trt_path.StaticCacheStep(model).eval()
    with torch.no_grad():
        out = model(ids, use_cache=True)
        kc, vc = trt_path.static_cache_from_past(out.past_key_values, Smax)
        kc[:, :, :, S:] = 5.0  # rows past the filled length hold anything
        vc[:, :, :, S:] = -3.0
        want = model(nxt, past_key_values=out.past_key_values, use_cache=True)
        logits, k_new, v_new = step(nxt, torch.full((B,), S), kc, vc)
        k_ref, v_ref = trt_path.static_cache_from_past(want.past_key_values, Smax)
        # ragged: sequence 0 sees only its first 3 rows (its own reference: a 3-token prefix)
        short = model(nxt[:1], past_key_values=model(ids[:1, :3], use_cache=True).past_key_values).logits[:, -1]
        ragged, _, _ = step(nxt, torch.tensor([3, S]), kc, vc)
    scale = want.logits.abs().max().item()
    assert (logits - want.logits[:, -1]).abs().max().item() < 1e-5 * scale
    assert (k_new[:, :, :, 0] - k_ref[:, :, :, S]).abs().max().item() < 1e-5
    assert (v_new[:, :, :, 0] - v_ref[:, :, :, S]).abs().max().item() < 1e-5
    assert (ragged[0] - short[0]).abs().max().item() < 1e-5 * scale
    assert (ragged[1] - logits[1]).abs().max().item() < 1e-5 * scale

    path = trt_path.export_decode_onnx(model, tmp_path / "step.onnx", batch=B, max_len=Smax)
    onnx.checker.check_model(str(path))
    sess = _ort_session(path)
    assert [i.name for i in sess.get_inputs()] == ["input_ids", "position", "k_cache", "v_cache"]
    for pos in (torch.full((B,), S), torch.tensor([3, S])):
        got = sess.run(None, {"input_ids": nxt.numpy(), "position": pos.numpy(), "k_cache": kc.numpy(),
                              "v_cache": vc.numpy()})
        with torch.no_grad():
            ref = step(nxt, pos, kc, vc)
        for g, r in zip(got, ref):
            assert np.abs(g - r.numpy()).max() < 1e-4 * max(1.0, np.abs(r.numpy()).max())


class _TorchEngine:
    """The decode engine's contract (bind named inputs once, execute into fixed outputs), run
    by StaticCacheStep in torch: DecodeEngine's bookkeeping without TensorRT."""

    def __init__(self, step):
        self.step = step

    def bind(self, inputs):
        self.inputs = inputs
        L, B, H, _, D = inputs["k_cache"].shape
        V = self.step.model.config.vocab_size
        self.outs = {"logits": torch.empty(B, V), "k_new": torch.empty(L, B, H, 1, D),
                     "v_new": torch.empty(L, B, H, 1, D)}
        return self.outs

    def execute(self):
        with torch.no_grad():
            for name, t in zip(("logits", "k_new", "v_new"), self.step(**self.inputs)):
                self.outs[name].copy_(t)


def test_decode_engine_bookkeeping_matches_greedy_generate():
    """DecodeEngine (rows written at each position, argmax, position advanced, restart) gives
    Hugging Face's greedy tokens when the engine is StaticCacheStep itself."""
    model = tiny_gpt2()
    B, S, Smax, n = 2, 5, 16, 6
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=n + 1, do_sample=False, pad_token_id=0)[:, S:]
        out = model(ids, use_cache=True)
    kc, vc = trt_path.static_cache_from_past(out.past_key_values, Smax)
    first = out.logits[:, -1].argmax(-1)
    eng = trt_path.DecodeEngine(_TorchEngine(trt_path.StaticCacheStep(model).eval()), kc, vc, first, S)
    for _ in range(2):  # and again after a restart
        eng.reset()
        toks = [eng.tok.clone()]
        for _ in range(n):
            eng.decode(1)
            toks.append(eng.tok.clone())
        assert torch.equal(torch.cat(toks, 1), want)
        assert int(eng.pos[0]) == S + n
    assert eng.graph is None and "CPU" in eng.graph_note
