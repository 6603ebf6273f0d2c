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
