"""CLI tests: bad input ends in one `error:` line and exit status 2, never a traceback.

A few run `python -m inference` in a subprocess (the real exit path); the rest
call `main()` in-process, which is the same code without the interpreter start.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout=120):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("INFERENCE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "inference", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("error:") or "Traceback" in ln]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1001, n_positions=64, bos_token_id=0,
                     eos_token_id=0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-gpt2"
    GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def test_subprocess_bad_backend_list():
    r = run_cli("bench", "--model", "gpt2", "--backends", "cute,cudnn")
    assert r.returncode == 2
    assert "cudnn" in one_error_line(r.stderr)


def test_subprocess_unknown_model_no_traceback():
    r = run_cli("generate", "--model", "definitely-not-a-model-xyz", "--backend", "reference")
    assert r.returncode == 2
    assert "cannot load model 'definitely-not-a-model-xyz'" in one_error_line(r.stderr)


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--model", "gpt2", "--precision", "fp4"], "invalid choice"),
    (["generate", "--model", "gpt2", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["bench", "--model", "gpt2", "--precisions", "bf16,int4"], "int4"),
    (["generate", "--model", "gpt3", "--random-weights", "--backend", "reference"], "unknown model 'gpt3'"),
    (["generate", "--model", "gpt2-xl", "--backend", "reference"], "--random-weights"),
])
def test_argument_errors(argv, needle, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("INFERENCE_DEBUG", raising=False)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse exits itself
        code = e.code
    assert code == 2
    assert needle in one_error_line(capsys.readouterr().err)


def test_too_many_positions(tiny_checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("INFERENCE_DEBUG", raising=False)
    code = main(["generate", "--model", str(tiny_checkpoint), "--backend", "reference", "--max-new-tokens", "60",
                 "--prompt", "a rather long prompt"])
    assert code == 2
    assert "exceeds the model's 64 positions" in one_error_line(capsys.readouterr().err)


@pytest.mark.skipif("torch.cuda.is_available()", reason="checks the no-GPU messages")
def test_gpu_needed_messages(capsys, monkeypatch):
    monkeypatch.delenv("INFERENCE_DEBUG", raising=False)
    assert main(["generate", "--model", "gpt2", "--random-weights"]) == 2
    assert "no CUDA GPU" in one_error_line(capsys.readouterr().err)
    assert main(["bench", "--model", "gpt2", "--random-weights"]) == 2
    assert "bench needs a CUDA GPU" in one_error_line(capsys.readouterr().err)


def test_generate_reference_backend(tiny_checkpoint, capsys):
    code = main(["generate", "--model", str(tiny_checkpoint), "--backend", "reference", "--prompt", "Hi",
                 "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "byte-level tokenizer" in out and "--- text ---" in out and "tokens/s" in out
    assert "same token at 8/8 positions (first divergence: none)" in out
    assert "--- startup ---" in out


def test_tune_flag_on_the_reference_backend_says_it_tunes_nothing(tiny_checkpoint, capsys):
    code = main(["generate", "--model", str(tiny_checkpoint), "--backend", "reference", "--prompt", "Hi",
                 "--max-new-tokens", "2", "--no-compare", "--tune"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing tuned for the reference backend" in out


def test_bench_cpu_smoke(tiny_checkpoint, tmp_path, capsys):
    """The whole bench pipeline (patching, timing, decode loop, profiler breakdown, report) on CPU."""
    import json

    code = main(["bench", "--model", str(tiny_checkpoint), "--device", "cpu", "--batch", "2", "--prompt-len", "16",
                 "--gen-len", "8", "--backends", "cute,cublas,tensorrt", "--precisions", "bf16,int8",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "skip cublas/int8" in out and "skip tensorrt/bf16" in out
    data = json.loads((tmp_path / "inference_tiny-gpt2_decode_b2_cpu.json").read_text())
    rows = {(r["backend"], r["precision"]): r for r in data["results"]}
    assert set(rows) == {("cute", "bf16"), ("cute", "int8"), ("cublas", "bf16")}
    assert rows[("cute", "bf16")]["top1_vs_eager"] == 1.0 and rows[("cute", "bf16")]["decode_ms_per_step"] > 0
    gemm_ops = {g["op"] for g in rows[("cute", "bf16")]["breakdown"]["prefill"]["gemms"]}
    assert gemm_ops == {"cute_inference::linear"}
    assert "| cute | int8 |" in (tmp_path / "inference_tiny-gpt2_decode_b2_cpu.md").read_text()


def test_bench_prefill_only(tiny_checkpoint, tmp_path, capsys):
    """--gen-len 0 times prefill alone (a full-context prompt leaves no room to decode)."""
    import json

    code = main(["bench", "--model", str(tiny_checkpoint), "--device", "cpu", "--batch", "1", "--prompt-len", "16",
                 "--gen-len", "0", "--backends", "cute", "--precisions", "bf16", "--no-profile", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    row = json.loads((tmp_path / "inference_tiny-gpt2_prefill_b1_cpu.json").read_text())["results"][0]
    assert row["prefill_ms"] > 0 and row["decode_ms_per_step"] is None and "prefill only" in row["note"]


BENCH_TOOLS = ("gemm", "attention", "quantized", "roofline", "tune_gemm", "ladder")


@pytest.mark.parametrize("tool", BENCH_TOOLS)
def test_benchmark_tools_without_gpu_say_so_in_one_line(tool):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU message")
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{tool}"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "Hopper GPU" in r.stderr, r.stderr


# --------------------------------------------------------------------------- Llama family


@pytest.fixture(scope="module")
def tiny_llama_checkpoint(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1001, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-qwen2"
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def test_generate_llama_family_reference_backend(tiny_llama_checkpoint, capsys):
    code = main(["generate", "--model", str(tiny_llama_checkpoint), "--backend", "reference", "--device", "cpu",
                 "--prompt", "Hi", "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "byte-level tokenizer" in out and "--- text ---" in out
    assert "(eager)" in out  # the static decoder, no CUDA graph on the CPU
    assert "same token at 8/8 positions (first divergence: none)" in out


def test_generate_llama_random_weights_banner(capsys, monkeypatch):
    """--random-weights with a published name: banner, byte tokenizer note, the model runs.
    The published shape is shrunk here (llama-3.2-1b takes ~30 s and 10 GB in fp32 on a CPU)."""
    from inference import models

    small = {**models.LLAMA_CONFIGS["llama-3.2-1b"], "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 1001}
    monkeypatch.setitem(models.LLAMA_CONFIGS, "llama-3.2-1b", small)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["generate", "--model", "llama-3.2-1b", "--random-weights", "--backend", "reference", "--device",
                 "cpu", "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "RANDOM WEIGHTS: the model is llama-3.2-1b-shaped" in out and "byte-level tokenizer" in out
    assert "same token at 4/4 positions" in out


def test_llama_family_bench_cpu_smoke(tiny_llama_checkpoint, tmp_path, capsys):
    """Llama-family bench: prefill at --batch, decode at each --decode-batch (the static
    decoder for ours and the baselines), one report per phase and batch."""
    import json

    code = main(["bench", "--model", str(tiny_llama_checkpoint), "--device", "cpu", "--batch", "2", "--prompt-len",
                 "16", "--gen-len", "8", "--decode-batch", "1,3", "--decode-prompt-len", "8", "--backends",
                 "cute,cublas", "--precisions", "bf16", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    pre = json.loads((tmp_path / "inference_tiny-qwen2_prefill_b2_cpu.json").read_text())
    assert {r["backend"] for r in pre["results"]} == {"cute", "cublas"}
    assert all(r["prefill_ms"] > 0 and r["phase"] == "prefill" for r in pre["results"])
    cute = next(r for r in pre["results"] if r["backend"] == "cute")
    assert cute["top1_vs_eager"] == 1.0
    for b in (1, 3):
        dec = json.loads((tmp_path / f"inference_tiny-qwen2_decode_b{b}_cpu.json").read_text())
        assert dec["batch"] == b and dec["prompt_len"] == 8
        assert all(r["decode_ms_per_step"] > 0 and r["batch"] == b for r in dec["results"])
        assert "decode_step" in dec["results"][0]["breakdown"]


def test_bench_integer_lists_say_so_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--model", "gpt2", "--decode-batch", "1,x"])
    assert e.value.code == 2 and "not a comma-separated list of positive integers" in capsys.readouterr().err


def test_subprocess_llama_quantized_precision_runs(tiny_llama_checkpoint):
    r = run_cli("generate", "--model", str(tiny_llama_checkpoint), "--backend", "reference", "--device", "cpu",
                "--precision", "fp8", "--max-new-tokens", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
