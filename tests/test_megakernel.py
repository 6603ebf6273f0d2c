"""The experimental one-kernel decode step (inference/megakernel.py).

CPU: the Triton kernel runs under Triton's interpreter with one program (its grid
barriers then pass at once) against the separate-kernel decode step of the same
patched model (reference backend): same greedy tokens, logits and cache rows at the
rounding of bf16, counters advanced, barrier counter reset. GPU: the real cooperative
launch, replayed in a CUDA graph by StaticDecoder, against the separate kernels.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ptx_check import assert_ptxas_no_spills

pytest.importorskip("transformers")
pytest.importorskip("triton")

_SCRIPT = r"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from inference.patch import patch_model
from inference.decode import StaticDecoder
from inference.megakernel import DecodeMegakernel

torch.manual_seed(0)
cfg = GPT2Config(n_embd=64, n_head=2, n_layer=2, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0)
m = GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.2)
m = patch_model(m, backend="reference", attention="sdpa")
for nsplit in (1, 2):
    dec = StaticDecoder(m, batch_size=1, max_len=32, cuda_graph=False)
    ids = torch.randint(0, 300, (1, 7), generator=torch.Generator().manual_seed(nsplit))
    dec.prefill(ids)
    state = [t.clone() for t in (dec._tok, dec._pos, dec._step, dec._out, *dec.k, *dec.v)]
    cap = {}
    orig = dec._ln_linear
    def grab(ln, lin, x):
        y = orig(ln, lin, x)
        cap["logits"] = y
        return y
    dec._ln_linear = grab
    ref_logits = []
    with torch.no_grad():
        for _ in range(3):
            dec.step()
            ref_logits.append(cap["logits"].float().view(-1)[:300].clone())
    ref = [t.clone() for t in (dec._tok, dec._pos, dec._step, dec._out, *dec.k, *dec.v)]
    for t, s in zip((dec._tok, dec._pos, dec._step, dec._out, *dec.k, *dec.v), state):
        t.copy_(s)
    mk = DecodeMegakernel(m, dec.k, dec.v, dec._tok, dec._pos, dec._step, dec._out, programs=1, keep_logits=True,
                          nsplit=nsplit)
    for i in range(3):
        mk()
        d = (mk.logits - ref_logits[i]).abs().max().item()
        assert d < 0.05 * ref_logits[i].abs().max().item(), (nsplit, i, d)
    got = (dec._tok, dec._pos, dec._step, dec._out, *dec.k, *dec.v)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    assert torch.equal(got[3], ref[3]), (got[3][0, :5], ref[3][0, :5])
    for a, b in zip(got[4:], ref[4:]):
        assert (a.float() - b.float()).abs().max().item() <= 0.02 * b.float().abs().max().item()
    assert mk.barrier.item() == 0 and int(mk.counts.abs().sum()) == 0
print("OK")
"""


def test_megakernel_interpreted_matches_separate_step():
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_megakernel_plan_says_why_not(monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    from inference.megakernel import MEGAKERNEL_ENV, megakernel_plan
    from inference.patch import patch_model

    cfg = GPT2Config(n_embd=64, n_head=2, n_layer=1, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0)
    m = patch_model(GPT2LMHeadModel(cfg).to(torch.bfloat16).eval(), backend="reference")
    caches = [torch.zeros(1, 2, 32, 32, dtype=torch.bfloat16)]
    monkeypatch.delenv(MEGAKERNEL_ENV, raising=False)
    assert "off" in megakernel_plan(m, 1, caches, caches)  # opt-in
    monkeypatch.setenv(MEGAKERNEL_ENV, "1")
    assert megakernel_plan(m, 2, caches, caches) == "batch > 1"
    assert "layout" in megakernel_plan(m, 1, caches, caches)  # CPU caches
    m2 = patch_model(GPT2LMHeadModel(cfg).eval(), backend="reference")  # fp32 model
    assert "dtype" in megakernel_plan(m2, 1, caches, caches)


@pytest.mark.gpu
@torch.no_grad()
def test_megakernel_matches_separate_kernels_on_gpu(monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    from inference.decode import StaticDecoder
    from inference.megakernel import MEGAKERNEL_ENV
    from inference.patch import patch_model

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=50257, n_positions=1024)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg).eval().to(torch.bfloat16)
    model.transformer.wte.weight.mul_(5.0)  # real margins between greedy choices
    model = patch_model(model, attention="cute", backend="cute")
    ids = torch.randint(0, 50257, (1, 100), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    monkeypatch.setenv(MEGAKERNEL_ENV, "0")
    ref = StaticDecoder(model, batch_size=1, max_len=200).generate(ids, 40)
    monkeypatch.setenv(MEGAKERNEL_ENV, "1")
    dec = StaticDecoder(model, batch_size=1, max_len=200)
    assert dec.megakernel is not None, dec.megakernel_off
    got = dec.generate(ids, 40)
    assert (got == ref).float().mean().item() >= 0.95, (got, ref)


# --------------------------------------------------------------------------- CuTe DSL chain


@pytest.mark.compile
def test_decode_chain_dsl_compiles(tmp_path):
    """The experimental DSL decode chain (inference/megakernel_dsl.py) for sm_90a on the
    CPU: bulk copies into the ring, bf16 mma.sync, the release/acquire grid counter, no spills."""
    import glob

    from inference.megakernel_dsl import ChainConfig, compile_chain

    compile_chain(ChainConfig(), keep_dir=str(tmp_path))
    path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(path).read()
    assert ".target sm_90a" in ptx
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "red.release.gpu.global.add.s32" in ptx and "ld.acquire.gpu" in ptx
    assert_ptxas_no_spills(path)


@pytest.mark.gpu
@torch.no_grad()
def test_decode_chain_dsl_matches_separate_kernels():
    """Two GPT-2 XL-width layers: the persistent chain against the separate one-row GEMVs
    and an fp32 reference with the same bf16 rounding points (error at most 2x theirs)."""
    import torch.nn.functional as F

    from inference.megakernel_dsl import chain_reference, decode_chain

    E, L = 1600, 2
    gen = torch.Generator("cuda").manual_seed(0)

    def rnd(*shape, scale=0.02, shift=0.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale + shift).to(torch.bfloat16)

    w = dict(Wa=rnd(L, 3 * E, E), Wo=rnd(L, E, E), Wf=rnd(L, 4 * E, E), Wp=rnd(L, E, 4 * E), ba=rnd(L, 3 * E),
             bo=rnd(L, E), bf=rnd(L, 4 * E), bp=rnd(L, E), g1=rnd(L, E, shift=1.0), b1=rnd(L, E),
             g2=rnd(L, E, shift=1.0), b2=rnd(L, E))
    h0 = rnd(1, E, scale=1.0, shift=0.5)
    got = decode_chain(w, h0).float()
    sep = chain_reference(w, h0).float()
    x = h0.float()
    bf = torch.bfloat16
    for i in range(L):
        q = (F.layer_norm(x, (E,), w["g1"][i].float(), w["b1"][i].float()).to(bf).float() @ w["Wa"][i].float().t()
             + w["ba"][i].float()).to(bf).float()
        x = (x + q[:, :E] @ w["Wo"][i].float().t() + w["bo"][i].float()).to(bf).float()
        ln2 = F.layer_norm(x, (E,), w["g2"][i].float(), w["b2"][i].float()).to(bf).float()
        ff = F.gelu(ln2 @ w["Wf"][i].float().t() + w["bf"][i].float(), approximate="tanh").to(bf).float()
        x = (x + ff @ w["Wp"][i].float().t() + w["bp"][i].float()).to(bf).float()
    assert torch.isfinite(got).all()
    err, err_sep = (got - x).abs().max().item(), (sep - x).abs().max().item()
    assert err <= 2 * err_sep + 1e-2, (err, err_sep)
