"""Tensor parallelism (inference/tp.py): a model sharded over 2 processes computes what the
unsharded model computes.

CPU: 2 processes on gloo, tiny fp32 GPT-2 / Llama / Qwen2 / Mistral models on the reference
backend (vocabularies that do not split evenly, GQA, Qwen2's q/k/v biases, a tied head):
logits within fp32 rounding, identical greedy tokens (StaticDecoder for GPT-2, EagerDecoder
for the Llama family), and random-weights models built sharded equal to the whole one; the
Llama family with its residual stream split by rows (sequence parallelism) equal to both.
GPU (`gpu`, >= 2 Hopper GPUs): the same on NCCL with our kernels in bf16, every all-reduce
backend, the decode step in a CUDA graph. TP-invariant arithmetic (inference/invariant.py), CPU
and GPU: sharded and whole bf16 models in that mode give bit-identical logits and greedy tokens.
"""

from __future__ import annotations

import copy
import os
import socket

import pytest
import torch

transformers = pytest.importorskip("transformers")

from inference import tp as TP  # noqa: E402
from tests.model_util import assert_within_2x_error  # noqa: E402

VOCAB = 1001  # odd: the last vocabulary shard is padded


def _tiny(kind: str, dtype=torch.float32, width: int = 64):
    """2 layers, 4 heads (GQA: 2 KV heads) of width / 4: 16 on the CPU, 64 on the GPU (our
    attention kernels' smallest head dim)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from tests.model_util import vary_weights

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                         eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg_cls, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                        "mistral": (MistralConfig, MistralForCausalLM)}[kind]
        cfg = cfg_cls(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0, tie_word_embeddings=kind == "llama")
        model = cls(cfg)
    return vary_weights(model).to(dtype).eval()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _greedy(model, ids, n):
    from inference.decoders import decoder_for

    dec = decoder_for(model, batch_size=ids.shape[0], max_len=ids.shape[1] + n)
    return dec.generate(ids, n)


def _join(rank: int, world: int, port: int, device: str):
    """This spawned process as rank `rank` of a torchrun-like launch: (group, device, dtype, backend)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    cuda = device == "cuda"
    group = TP.init_tp(world, "auto" if cuda else None)  # auto: setup() builds every backend's buffers
    if cuda:
        return group, torch.device("cuda", rank), torch.bfloat16, "cute"
    return group, torch.device("cpu"), torch.float32, "reference"


def _worker(rank: int, world: int, port: int, out: str, device: str, kinds, allreduces) -> None:
    group, dev, dtype, backend = _join(rank, world, port, device)
    group.seq_parallel = False  # the replicated stream here; _sp_worker covers the split one
    cuda = dev.type == "cuda"
    width = 256 if cuda else 64
    from inference.patch import patch_model

    results = {}
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1)).to(dev)
    for kind in kinds:
        base = _tiny(kind, dtype, width).to(dev)
        if cuda:  # the fp32 model's logits: what the bf16 runs' errors are measured against
            with torch.no_grad():
                results[(kind, "fp32")] = copy.deepcopy(base).float()(ids).logits.float().cpu()
        whole = patch_model(copy.deepcopy(base), backend=backend, attention="cute")
        sharded = patch_model(copy.deepcopy(base), backend=backend, attention="cute", tp=group)
        group.setup(dev, dtype)
        for allreduce in allreduces:
            group.use(allreduce) if allreduce != "auto" else None
            with torch.no_grad():
                ref, got = whole(ids).logits.float(), sharded(ids).logits.float()
            results[(kind, allreduce, "logits")] = (ref.cpu(), got.cpu())
            results[(kind, allreduce, "tokens")] = (_greedy(whole, ids, 6).cpu(), _greedy(sharded, ids, 6).cpu())
            if kind != "gpt2":  # sequence-parallel RMSNorms (here from 2 rows on): the same logits, bit for bit
                group.sp_min_rows = 2
                with torch.no_grad():
                    results[(kind, allreduce, "sp-norm identical")] = (got.cpu(), sharded(ids).logits.float().cpu())
                group.sp_min_rows = TP.SP_MIN_ROWS
            if kind != "gpt2":  # the sharded model's own forward with transformers' cache, token by token
                from inference.decode import EagerDecoder

                dec = EagerDecoder(sharded, batch_size=ids.shape[0], max_len=ids.shape[1] + 6)
                results[(kind, allreduce, "hf forward tokens")] = (results[(kind, allreduce, "tokens")][0],
                                                                   dec.generate(ids, 6).cpu())
    # Random weights built sharded are the whole model's slices: same logits.
    for kind in kinds[:2]:
        cfg = _tiny(kind, width=width).config
        models = [TP.build_random(cfg, device=dev, dtype=dtype, tp=t) for t in (None, group)]
        with torch.no_grad():
            ref, got = (patch_model(m, backend=backend, attention="cute")(ids).logits.float() for m in models)
        results[(kind, "random", "logits")] = (ref.cpu(), got.cpu())
    if rank == 0:
        torch.save(results, out)
    TP.shutdown()
    os._exit(0)  # no interpreter teardown of the process group: it can hang or abort after the results are in


def _run(tmp_path, device, kinds, allreduces=("nccl",), world=2) -> dict:
    import torch.multiprocessing as mp

    out = str(tmp_path / "tp.pt")
    mp.spawn(_worker, args=(world, _free_port(), out, device, kinds, allreduces), nprocs=world, join=True)
    return torch.load(out)


def _check(results, rtol, atol_frac, exact_tokens=True, exact_sp=True):
    """exact_sp: sequence-parallel norms bit-identical to replicated ones (the CPU; on the GPU a
    reduction over fewer rows may be scheduled differently). Where the fp32 model's logits are
    in the results (bf16 on the GPU), the sharded model's error against them must stay within
    2x the whole model's (max and RMS): the partial sums of a row-parallel product round apart."""
    for key, pair in results.items():
        if len(key) == 2:  # (kind, "fp32")
            continue
        ref, got = pair
        f32 = results.get((key[0], "fp32"))
        if key[-1].endswith("logits") or (key[-1] == "sp-norm identical" and not exact_sp):
            assert got.shape == ref.shape, key
            if f32 is not None and key[1] != "random":
                assert_within_2x_error(got, ref, f32, key)
                continue
            torch.testing.assert_close(got, ref, rtol=rtol, atol=atol_frac * float(ref.abs().max()), msg=str(key))
        elif key[-1] == "sp-norm identical":
            assert torch.equal(got, ref), key
        elif exact_tokens:
            assert torch.equal(got, ref), f"{key}: {got.tolist()} != {ref.tolist()}"


def test_sharded_equals_whole_cpu(tmp_path):
    results = _run(tmp_path, "cpu", ("gpt2", "llama", "qwen2", "mistral"))
    _check(results, 1e-4, 1e-4)


@pytest.mark.gpu
def test_sharded_equals_whole_gpu(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    allreduces = ["nccl"] + [a for a in ("one-shot", "two-shot", "push") if TP.symm_mem_problem(a) is None]
    results = _run(tmp_path, "cuda", ("gpt2", "llama", "qwen2"), allreduces)
    # bf16: the partial sums round differently; tokens of these varied-weight models are well separated.
    _check(results, 2e-2, 2e-2, exact_tokens=True, exact_sp=False)


def _push_worker(rank: int, world: int, port: int, out: str) -> None:
    """The push all-reduce against the exact sum of the gathered inputs: sizes around its
    block and its buffer's end, fp32 and bf16, eager calls (each a new epoch) and a CUDA graph
    replayed with new inputs (the epochs advance on the device)."""
    group, dev, _, _ = _join(rank, world, port, "cuda")
    group.setup(dev, torch.bfloat16)
    group.use("push")
    push = group._push
    g = torch.Generator(device=dev).manual_seed(rank)
    failures = []

    def check(x, y, what):
        xs = group.all_gather(x)  # [world, ...]
        want = xs.float().sum(0).to(x.dtype)  # rank order, in fp32, rounded once: what the kernel does
        ys = group.all_gather(y)
        if not torch.equal(y, want):
            failures.append(f"{what}: max diff {float((y.float() - want.float()).abs().max())}")
        if not torch.equal(ys[0], ys[-1]):
            failures.append(f"{what}: ranks disagree")

    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 7, 1023, 1024, 1025, 4096, 5000, 131072, push.max_bytes // torch.finfo(dtype).bits * 8):
            for rep in range(3):
                x = torch.randn(n, device=dev, generator=g).to(dtype)
                check(x, group.all_reduce(x), f"eager {dtype} n={n} rep={rep}")
    x = torch.randn(3, 4096, device=dev, generator=g).to(torch.bfloat16)
    y = group.all_reduce(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = group.all_reduce(group.all_reduce(x) * 0.5)
    for rep in range(5):
        x.copy_(torch.randn(3, 4096, device=dev, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        mid = group.all_gather(x).float().sum(0).to(x.dtype) * 0.5
        want = group.all_gather(mid).float().sum(0).to(x.dtype)
        if not torch.equal(y, want):
            failures.append(f"graph replay {rep}: max diff {float((y.float() - want.float()).abs().max())}")
    if push.failed():
        failures.append("a wait gave up")
    if rank == 0:
        torch.save(failures, out)
    TP.shutdown()
    os._exit(0)


@pytest.mark.compile
def test_push_all_reduce_compiles_for_sm90():
    """The push kernel's protocol in its PTX: flags raised with release and read with acquire at
    system scope by one thread, the peers' blocks read past L1, 16-byte stores over NVLink."""
    import re

    pytest.importorskip("triton")
    from inference.allreduce import MAX_POLLS, _push_all_reduce_kernel
    from tests.test_gemm_host import _triton_ptx_sm90

    sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "data_ptrs": "*i64", "flag_ptrs": "*i64",
           "counter_ptr": "*i32", "error_ptr": "*i32", "rank": "i32"}
    const = {"N_MAX": 1 << 19, "MAX_CTAS": 512, "SIZE": 4, "BLOCK": 1024, "MAX_POLLS": MAX_POLLS, "PDL": True}
    ptx = _triton_ptx_sm90(_push_all_reduce_kernel, sig, const)
    # one flag store per rank in the unrolled loop (the own rank's is skipped at run time)
    assert len(re.findall(r"atom\.global\.sys\.release\.exch", ptx)) == 4
    assert len(re.findall(r"ld\.global\.sys\.acquire", ptx)) >= 3
    assert "ld.volatile.global" in ptx and "st.global" in ptx
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


@pytest.mark.gpu
def test_push_all_reduce_gpu(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    why = TP.symm_mem_problem("push")
    if why is not None:
        pytest.skip(why)
    import torch.multiprocessing as mp

    out = str(tmp_path / "push.pt")
    mp.spawn(_push_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    assert torch.load(out) == []


# --------------------------------------------------------------------------- single process


def test_kv_heads_must_split():
    model = _tiny("llama")
    with pytest.raises(ValueError, match="num_key_value_heads % tp"):
        TP._plan(model, 0, 4)


def test_vocab_shards_cover_vocab():
    for size in (1, 2, 3, 8):
        rows = []
        for r in range(size):
            per, start, n = TP.vocab_shard(50257, r, size)
            rows += list(range(start, start + n))
            assert n <= per
        assert rows == list(range(50257))


def test_patch_model_rejects_bad_tp():
    from inference.patch import patch_model

    with pytest.raises(ValueError, match="needs torch.distributed"):
        patch_model(_tiny("gpt2"), backend="reference", tp=2)
    with pytest.raises(TypeError, match="tp must be"):
        patch_model(_tiny("gpt2"), backend="reference", tp="2")
    assert patch_model(_tiny("gpt2"), backend="reference", tp=1).cute_patch["backend"] == "reference"


def test_cli_tp_must_match_the_launch(capsys, monkeypatch):
    from inference.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", "--model", "gpt2", "--random-weights", "--tp", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --tp 2 needs torchrun --nproc-per-node 2 "
                                               "(this launch has WORLD_SIZE=1)")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["bench", "--model", "gpt2", "--random-weights"]) == 2
    assert "pass --tp 2" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["generate", "--model", "gpt2", "--random-weights", "--allreduce", "nccl"]) == 2
    assert "--allreduce goes with --tp" in capsys.readouterr().err


def test_bench_tp_writes_tokens_and_agreement(tmp_path, monkeypatch):
    """bench --tp on the CPU (one process, the reference kernels): the results file carries what
    the GPU script compares across TP degrees."""
    import json

    from inference.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = ["bench", "--model", "gpt2", "--random-weights", "--device", "cpu", "--tp", "1", "--batch", "1",
            "--prompt-len", "4", "--decode-prompt-len", "4", "--gen-len", "3", "--out", str(tmp_path)]
    assert main(args) == 0
    first = tmp_path / "tp_gpt2_tp1_cpu.json"
    assert main(args + ["--tp-reference", str(first)]) == 0
    d = json.loads(first.read_text())
    row = d["decode"]["none"]
    assert len(row["tokens"]) == 3 and len(row["margins"]) == 3 and row["decoder"] == "StaticDecoder"
    assert d["teacher_forced_vs_reference"] == {"reference_tp": 1, "reference_tp_invariant": 0, "positions": 3,
                                                "agree": 3, "disagree_at": [], "margin_here": [],
                                                "margin_reference": [], "teacher_forced_margins_identical": True,
                                                "greedy_identical": True,
                                                "greedy_first_difference": None}


# --------------------------------------------------------------------------- sequence parallelism


def _sp_worker(rank: int, world: int, port: int, out: str, device: str, kinds) -> None:
    """The Llama family with the residual stream split by rows (CUTE_KERNELS_TP_SEQ_PARALLEL,
    from 2 rows on here) against the whole model and the same shard without it."""
    group, dev, dtype, backend = _join(rank, world, port, device)
    cuda = dev.type == "cuda"
    from inference.decode import EagerDecoder
    from inference.patch import patch_model

    results = {}
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1)).to(dev)
    odd = ids[:1]  # 9 rows: do not split over 2 ranks, the replicated stream runs
    group.setup(dev, dtype)
    for kind in kinds:
        base = _tiny(kind, dtype, 256 if cuda else 64).to(dev)
        if cuda:
            with torch.no_grad():
                results[(kind, "fp32")] = copy.deepcopy(base).float()(ids).logits.float().cpu()
        whole = patch_model(copy.deepcopy(base), backend=backend, attention="cute")
        sharded = patch_model(copy.deepcopy(base), backend=backend, attention="cute", tp=group)
        group.seq_parallel, group.sp_min_rows = False, 2
        with torch.no_grad():
            ref, plain = whole(ids).logits.float(), sharded(ids).logits.float()
            plain_odd = sharded(odd).logits.float()
        tokens = _greedy(whole, ids, 6).cpu()
        group.seq_parallel = True
        p2p, group.sp_p2p = group.sp_p2p, False  # NCCL's reduce-scatter here; the copy-engine one below
        calls = []
        group.reduce_scatter = lambda x, _rs=group.reduce_scatter: calls.append(x.shape) or _rs(x)
        with torch.no_grad():
            got = sharded(ids).logits.float()
            # o_proj and down_proj per layer, and the embedding's sum (only the local rows are kept)
            assert len(calls) == 2 * sharded.config.num_hidden_layers + 1, calls
            got_odd = sharded(odd).logits.float()
            assert len(calls) == 2 * sharded.config.num_hidden_layers + 1, "9 rows over 2 ranks: no reduce-scatter"
        del group.reduce_scatter
        group.sp_p2p = p2p
        if cuda:
            assert group._p2p is not None, "setup() builds the copy-engine collectives on GPUs"
            with torch.no_grad():
                results[(kind, "sp", "p2p logits")] = (ref.cpu(), sharded(ids).logits.float().cpu())
                results[(kind, "sp", "p2p second call logits")] = (ref.cpu(), sharded(ids).logits.float().cpu())
                group.sp_overlap = not group.sp_overlap  # the reduce-scatter with the other schedule
                results[(kind, "sp", "p2p other overlap logits")] = (ref.cpu(), sharded(ids).logits.float().cpu())
                group.sp_overlap = not group.sp_overlap
        results[(kind, "sp", "logits")] = (ref.cpu(), got.cpu())
        results[(kind, "sp", "vs tp logits")] = (plain.cpu(), got.cpu())
        results[(kind, "sp", "fallback identical")] = (plain_odd.cpu(), got_odd.cpu())
        results[(kind, "sp", "tokens")] = (tokens, _greedy(sharded, ids, 6).cpu())
        dec = EagerDecoder(sharded, batch_size=ids.shape[0], max_len=ids.shape[1] + 6)  # decode steps of 2 rows: SP too
        results[(kind, "sp", "hf forward tokens")] = (tokens, dec.generate(ids, 6).cpu())
        assert group.sp_shape is None, "the final norm ends the sequence-parallel forward"
        group.seq_parallel, group.sp_min_rows = False, TP.SP_MIN_ROWS
    if rank == 0:
        torch.save(results, out)
    TP.shutdown()
    os._exit(0)


def _run_sp(tmp_path, device, kinds, world=2) -> dict:
    import torch.multiprocessing as mp

    out = str(tmp_path / "sp.pt")
    mp.spawn(_sp_worker, args=(world, _free_port(), out, device, kinds), nprocs=world, join=True)
    return torch.load(out)


def test_seq_parallel_equals_whole_cpu(tmp_path):
    results = _run_sp(tmp_path, "cpu", ("llama", "qwen2", "mistral"))
    for kind in ("llama", "qwen2", "mistral"):
        assert torch.equal(*results[(kind, "sp", "fallback identical")]), kind
    _check({k: v for k, v in results.items() if k[-1] != "fallback identical"}, 1e-4, 1e-4)


@pytest.mark.gpu
def test_seq_parallel_equals_whole_gpu(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = _run_sp(tmp_path, "cuda", ("llama", "qwen2"))
    for kind in ("llama", "qwen2"):
        assert torch.equal(*results[(kind, "sp", "fallback identical")]), kind
    # bf16: the reduce-scatter sums the partials in another order than the all-reduce; judged by
    # the 2x-error rule against the fp32 model, as test_sharded_equals_whole_gpu.
    _check({k: v for k, v in results.items() if k[-1] != "fallback identical"}, 2e-2, 2e-2)


@pytest.mark.compile
def test_sum_pair_add_compiles_for_sm90():
    """The copy-engine reduce-scatter's add: (a + b) rounded to bf16, then + residual rounded;
    no FMA folds the two sums into one rounding."""
    import re

    from inference.llama_kernels import _sum_pair_add_kernel
    from tests.test_gemm_host import _triton_ptx_sm90

    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "r_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32"}
    ptx = _triton_ptx_sm90(_sum_pair_add_kernel, sig, {"BLOCK": 4096})
    assert len(re.findall(r"\badd(?:\.rn)?\.bf16", ptx)) >= 2 and "fma" not in ptx


@pytest.mark.gpu
def test_sum_pair_add_matches_torch_gpu():
    """Within one rounding of torch.add(a, b).add_(r) (which rounds each sum through fp32 first)."""
    from inference.llama_kernels import sum_pair_add

    g = torch.Generator(device="cuda").manual_seed(3)
    a, b, r = (torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    got, ref = sum_pair_add(a, b, r), torch.add(a, b).add_(r)
    torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=0)
    assert (got != ref).float().mean() < 1e-4
    with pytest.raises(ValueError, match="contiguous 16-bit"):
        sum_pair_add(a, b.t(), r)


def test_p2p_collectives_take_only_what_their_slots_hold():
    """Rows that split evenly and slots within MAX_SLOT_BYTES; anything else goes to NCCL
    (no buffer is allocated to decide)."""
    from inference.sp_collectives import MAX_SLOT_BYTES, P2PSeqCollectives

    c = P2PSeqCollectives("g", 0, 2, torch.device("cpu"))
    assert c.fits(8192, 4096, torch.bfloat16) and c.fits(2048, 8192, torch.bfloat16)
    assert not c.fits(8191, 4096, torch.bfloat16)
    rows = MAX_SLOT_BYTES // (4096 * 2)
    assert c.fits(rows, 4096, torch.bfloat16) and not c.fits(rows + 2, 4096, torch.bfloat16)
    assert c._buf is None


# --------------------------------------------------------------------------- TP-invariant arithmetic


def _inv_worker(rank: int, world: int, port: int, out: str, device: str, kinds, pieces: int) -> None:
    """inference/invariant.py: the whole model and its shard, both with tp_invariant=pieces, give
    the same logits bit for bit and the same greedy tokens (the static decoder, prompt and decode
    steps; transformers' own loop with its cache), in bf16."""
    group, dev, _, backend = _join(rank, world, port, device)
    group.setup(dev, torch.bfloat16)
    cuda = dev.type == "cuda"
    from inference.decode import EagerDecoder
    from inference.patch import patch_model

    results = {}
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1)).to(dev)
    for kind in kinds:
        base = _tiny(kind, torch.bfloat16, 256 if cuda else 64).to(dev)
        whole = patch_model(copy.deepcopy(base), backend=backend, attention="cute", tp_invariant=pieces)
        sharded = patch_model(copy.deepcopy(base), backend=backend, attention="cute", tp=group, tp_invariant=pieces)
        with torch.no_grad():
            results[(kind, "logits")] = (whole(ids).logits.cpu(), sharded(ids).logits.cpu())
        results[(kind, "static decoder tokens")] = (_greedy(whole, ids, 8).cpu(), _greedy(sharded, ids, 8).cpu())
        results[(kind, "hf loop tokens")] = tuple(
            EagerDecoder(m, batch_size=2, max_len=ids.shape[1] + 8).generate(ids, 8).cpu() for m in (whole, sharded))
    if rank == 0:
        torch.save(results, out)
    TP.shutdown()
    os._exit(0)


def _run_inv(tmp_path, device, kinds, pieces=2, world=2) -> dict:
    import torch.multiprocessing as mp

    out = str(tmp_path / "inv.pt")
    mp.spawn(_inv_worker, args=(world, _free_port(), out, device, kinds, pieces), nprocs=world, join=True)
    return torch.load(out)


def _check_identical(results):
    for key, (ref, got) in results.items():
        assert ref.shape == got.shape and torch.equal(ref, got), (
            f"{key}: max diff {float((ref.float() - got.float()).abs().max())}")


def test_tp_invariant_identical_cpu(tmp_path):
    _check_identical(_run_inv(tmp_path, "cpu", ("llama", "qwen2"), pieces=4))


@pytest.mark.gpu
@pytest.mark.parametrize("pieces,kinds", [(2, ("llama", "qwen2")), (4, ("llama",))])
def test_tp_invariant_identical_gpu(tmp_path, pieces, kinds):
    """2 pieces: one per rank (the push all-reduce adds them in decode, the all-to-all in a
    prefill); 4: two per rank (gathered and added in order)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _check_identical(_run_inv(tmp_path, "cuda", kinds, pieces))


def test_tp_invariant_linear_matches_torch():
    """Pieces summed in order: within fp32 rounding of the whole product; bias and residual in
    the same sum; pieces that do not split K or the ranks are refused."""
    from inference import invariant

    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(3, 5, 64, generator=g), torch.randn(24, 64, generator=g)
    b, r = torch.randn(24, generator=g), torch.randn(3, 5, 24, generator=g)
    ref = (x.double() @ w.double().t() + b.double() + r.double()).float()
    for pieces in (1, 2, 8):
        got = invariant.linear(x, w, b, r, pieces=pieces, backend="reference")
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="do not split"):
        invariant.linear(x, w, pieces=3, backend="reference")
    assert invariant.gemm_config(1).tile_mn == (64, 64) and invariant.gemm_config(65).tile_mn == (128, 128)
    assert invariant.gemm_config(invariant.WIDE_TILE_ROWS).tile_mn == (128, 256)


def test_tp_invariant_is_validated(monkeypatch):
    from inference.patch import patch_model

    with pytest.raises(ValueError, match="Llama family in bf16 with attention='cute'"):
        patch_model(_tiny("gpt2"), backend="reference", attention="cute", tp_invariant=2)
    with pytest.raises(ValueError, match="Llama family in bf16 with attention='cute'"):
        patch_model(_tiny("llama"), backend="reference", attention="sdpa", tp_invariant=2)
    with pytest.raises(ValueError, match="tp_invariant must be an int"):
        patch_model(_tiny("llama"), backend="reference", attention="cute", tp_invariant=-1)
    # intermediate_size 128 / 3 pieces: refused with the module named
    with pytest.raises(ValueError, match="must split into 3 pieces"):
        patch_model(_tiny("llama"), backend="reference", attention="cute", tp_invariant=3)
    monkeypatch.setenv("CUTE_KERNELS_TP_INVARIANT", "2")
    m = patch_model(_tiny("llama"), backend="reference", attention="cute")
    assert m.cute_invariant == 2 and m.model.layers[0].mlp.down_proj.invariant_pieces == 2
    monkeypatch.setenv("CUTE_KERNELS_TP_INVARIANT", "x")
    with pytest.raises(ValueError, match="CUTE_KERNELS_TP_INVARIANT must be an integer"):
        patch_model(_tiny("llama"), backend="reference", attention="cute")


@pytest.mark.gpu
def test_invariant_gemm_bits_do_not_depend_on_the_shard_gpu():
    """What invariant mode rests on: with one GemmConfig, an element's fp32 sum is the same bits
    whichever N-slice of the weight (column-parallel), M rows and operand strides the call has,
    and the K pieces of a row-parallel product are the same computed from views or from copies."""
    from inference import invariant

    g = torch.Generator(device="cuda").manual_seed(11)
    for M in (1, 7, 64, 200, 2048):
        x = torch.randn(M, 4096, device="cuda", generator=g).bfloat16()
        w = torch.randn(6144, 4096, device="cuda", generator=g).bfloat16()
        full = invariant.matmul(x, w, "cute")
        for lo, hi in ((0, 3072), (3072, 6144), (1024, 1536)):
            assert torch.equal(invariant.matmul(x, w[lo:hi].contiguous(), "cute"), full[:, lo:hi]), (M, lo)
        half = invariant.matmul(x[:, 2048:], w[:, 2048:], "cute")
        assert torch.equal(invariant.matmul(x[:, 2048:].contiguous(), w[:, 2048:].contiguous(), "cute"), half)
        torch.testing.assert_close(full, (x.double() @ w.double().t()).float(), rtol=1e-4, atol=1e-3)
        if M > 1:
            assert torch.equal(invariant.matmul(x[1:], w, "cute"), full[1:]), M
        rounded = invariant.matmul(x, w, "cute", torch.bfloat16)
        assert torch.equal(invariant.matmul(x, w[3072:].contiguous(), "cute", torch.bfloat16), rounded[:, 3072:])


@pytest.mark.compile
@pytest.mark.parametrize("rows,out_dtype", [(1, torch.float32), (65, torch.float32), (1024, torch.float32),
                                            (1, torch.bfloat16), (1024, torch.bfloat16)])
def test_invariant_gemm_configs_compile_for_sm90(tmp_path, rows, out_dtype):
    """Invariant mode's GEMM configs, fp32 and bf16 out, as invariant.matmul launches them (x and
    the weight K-major, the weight handed over as torch.mm's [K, N])."""
    import glob

    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from inference import invariant

    cfg = invariant.gemm_config(rows)
    assert cfg.split_k == 1 and not cfg.swap_ab
    cfg.validate(2, out_dtype.itemsize)
    _compile(torch.bfloat16, torch.bfloat16, out_dtype, "k", "k", cfg, Epilogue(), "Float32",
             keep_dir=str(tmp_path), b_kn=True)
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx


def test_cli_tp_invariant_needs_tp(capsys, monkeypatch):
    from inference.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", "--model", "llama-3-8b", "--random-weights", "--tp-invariant", "2"]) == 2
    assert "--tp-invariant P (P >= 0) goes with --tp" in capsys.readouterr().err
