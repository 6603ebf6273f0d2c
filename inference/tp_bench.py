"""`torchrun --nproc-per-node N -m inference bench --tp N ...`: the patched model sharded over N
GPUs (inference/tp.py), timed per rank.

What it measures (rank 0 writes `tp_<model>_tp<N>_<gpu>.json` under --out):
- prefill: one no-cache forward over [batch, prompt_len] keeping the last position's logits
  (what a generation needs; the full-vocabulary logits of every position would add an
  all-gather of batch x prompt_len x vocab), CUDA-event timed, median of 5 after 2 warm-ups.
  MFU = this rank's FLOPs / time / the GPU's bf16 peak. The Llama family's prefill is timed
  again with the sequence-parallel residual stream switched the other way
  (CUTE_KERNELS_TP_SEQ_PARALLEL; `prefill_seq_parallel`: on and off, the other setting profiled).
- decode, batch 1: greedy tokens after a --decode-prompt-len prompt, one CUDA graph per token
  (the model's static decoder, decoders.decoder_for), for every --allreduce backend (the graph is captured again
  per backend). MBU = this rank's weights + its KV rows read per step / time / HBM bandwidth.
- the greedy tokens (and the top-1 minus top-2 logit margin at each position, teacher-forced)
  so that runs at different TP degrees can be compared token by token.
- all-reduce latency: 64 all-reduces of one decode row [1, hidden] captured in one CUDA graph,
  per backend (what a decode step of Llama-3-8B issues).

Random weights are built sharded and are the same model at every TP degree (tp.build_random).
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import torch

from cute_kernels.runtime import hardware

from .adapters import adapter_for
from .decoders import decoder_for
from .tp import ALLREDUCES, build_random, init_tp, shutdown


def _events_ms(fn, cuda: bool, warmup: int = 2, reps: int = 5) -> float:
    """Median wall time of fn (CUDA events on the current stream), after warm-up calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def _decode_ms(dec, ids, steps: int, cuda: bool) -> float:
    dec.prefill(ids)
    dec.decode(1)  # captures outside the timing
    times = []
    for _ in range(3):
        dec.prefill(ids)
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dec.decode(steps)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / steps)
        else:
            t0 = time.perf_counter()
            dec.decode(steps)
            times.append(1e3 * (time.perf_counter() - t0) / steps)
    return sorted(times)[1]


def _teacher_forced(model, seq: torch.Tensor, prompt_len: int) -> tuple[list[int], list[float]]:
    """The argmax and the top-1 minus top-2 logit at each generated position of seq [1, S],
    teacher-forced: how near a tie each greedy choice was (another TP degree may flip only
    near-ties)."""
    with torch.no_grad():
        logits = model(seq, use_cache=False).logits[0, prompt_len - 1:-1].float()
    top = logits.topk(2, -1)
    return top.indices[:, 0].tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()


def _agreement(model, prompt: torch.Tensor, path: str, mine: list[int] | None = None) -> dict:
    """Another run's greedy tokens (its results file) teacher-forced through this model: at how
    many positions this model picks the same token, and the margins where it does not; with
    `mine` (this run's greedy tokens), whether the two runs generated the same tokens."""
    if not Path(path).is_file():
        return {"error": f"{path}: no such results file"}
    ref = json.loads(Path(path).read_text())
    row = next((r for r in ref["decode"].values() if "tokens" in r), None)
    if row is None or ref.get("decode_prompt_len") != prompt.shape[1]:
        return {"error": f"{path}: no greedy tokens for a {prompt.shape[1]}-token prompt"}
    toks = torch.tensor([row["tokens"]], device=prompt.device)
    picks, margins = _teacher_forced(model, torch.cat([prompt, toks], 1), prompt.shape[1])
    off = [i for i, (a, b) in enumerate(zip(picks, row["tokens"])) if a != b]
    out = {"reference_tp": ref.get("tp"), "reference_tp_invariant": ref.get("tp_invariant", 0),
           "positions": len(picks), "agree": len(picks) - len(off), "disagree_at": off,
           "margin_here": [margins[i] for i in off], "margin_reference": [row["margins"][i] for i in off]}
    if len(row["margins"]) == len(margins):  # the reference's own teacher-forced margins over the same tokens
        out["teacher_forced_margins_identical"] = margins == row["margins"]
    if mine is not None:  # this run's own greedy tokens (its decoder, free-running) against the reference's
        out["greedy_identical"] = mine == row["tokens"]
        out["greedy_first_difference"] = next((i for i, (a, b) in enumerate(zip(mine, row["tokens"])) if a != b),
                                              None)
    return out


def allreduce_us(group, hidden: int, dtype, device, n: int = 64, reps: int = 20) -> float | None:
    """Microseconds per all-reduce of a [1, hidden] row: n of them back to back in one CUDA graph,
    replayed `reps` times (CUDA only)."""
    if device.type != "cuda" or group is None:
        return None
    x = torch.randn(1, hidden, device=device, dtype=dtype)

    def run():
        y = x
        for _ in range(n):
            y = group.all_reduce(y.clone())

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    group.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        graph.replay()
    b.record()
    b.synchronize()
    return 1e3 * a.elapsed_time(b) / (reps * n)


def _flipped(group, switch: str, ms: float, time_it) -> dict:
    """{setting: prefill ms} for one boolean switch of the TP group: `ms` as set, time_it()
    with it flipped (then restored)."""
    on = getattr(group, switch)
    setattr(group, switch, not on)
    try:
        with torch.no_grad():
            other = time_it()
    finally:
        setattr(group, switch, on)
    return {on: ms, not on: other}


def run_tp_bench(args) -> int:
    import transformers

    from .bench import decode_bytes, decode_timeline, prefill_flops, profile_breakdown
    from .models import RANDOM_BANNER, UserError, check_positions, load_config, load_model
    from .patch import patch_model

    transformers.utils.logging.disable_progress_bar()
    if args.decode_prompt_len is None:
        args.decode_prompt_len = 128
    cuda = (args.device or "cuda") == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UserError("bench --tp needs CUDA GPUs (none found); --device cpu smoke-tests it on gloo")
    from cute_kernels.runtime import env

    from .tp import ALLREDUCE_ENV

    allreduces = list(args.allreduce or [env.get(ALLREDUCE_ENV)])
    # The symmetric buffer is set up when any backend that needs it is asked for.
    group = init_tp(args.tp, "nccl" if allreduces == ["nccl"] else "auto") if args.tp > 1 else None
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = "cute" if cuda else "reference"
    cfg = load_config(args.model, random_weights=args.random_weights)
    gen = max(args.gen_len, 2)
    check_positions(cfg, max(args.prompt_len, args.decode_prompt_len), gen)
    if args.random_weights:
        print(RANDOM_BANNER.format(name=args.model))
        model = build_random(cfg, device=device, dtype=dtype, tp=group)
    else:
        model = load_model(args.model, cfg, random_weights=False, device=device, dtype=dtype)
    t0 = time.perf_counter()
    if group is not None:
        group.setup(device, dtype)
    patch_model(model, backend=backend, attention=args.attention, tp=group, tp_invariant=args.tp_invariant)
    ad = adapter_for(model)
    size = 1 if group is None else group.size
    print(f"model={args.model} tp={size} attention={args.attention} backend={backend} "
          f"weights per rank {sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9:.2f} GB")
    gen_ids = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=gen_ids).to(device)
    dec_ids = torch.randint(0, cfg.vocab_size, (1, args.decode_prompt_len), generator=gen_ids).to(device)
    part = hardware.current() if cuda else None
    result = {"model": args.model, "tp": size, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
              "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "transformers": transformers.__version__, "random_weights": args.random_weights,
              "attention": args.attention, "tp_invariant": model.cute_patch["tp_invariant"],
              "batch": args.batch, "prompt_len": args.prompt_len,
              "decode_prompt_len": args.decode_prompt_len, "gen_len": gen,
              "weight_gb_per_rank": sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9,
              # two row-parallel projections per layer and the embedding; the head adds one all-gather
              "allreduces_per_token": 2 * ad.n_layers + 1 if size > 1 else 0}

    # The prefill A/Bs flip sequence-parallel switches, which invariant mode keeps off.
    ab_prefill = group is not None and not result["tp_invariant"]
    with torch.no_grad():
        ms = _events_ms(lambda: model(ids, use_cache=False, logits_to_keep=1), cuda)
    # FLOPs per rank; logits for the last position only.
    flops = prefill_flops(ad, args.batch, args.prompt_len) - 2.0 * args.batch * (args.prompt_len - 1) * \
        ad.head_vocab * ad.hidden
    result["prefill"] = {"ms": ms, "tok_s": args.batch * args.prompt_len / ms * 1e3,
                         "tflops_per_rank": flops / (ms * 1e-3) / 1e12,
                         "mfu_pct": 100 * flops / (ms * 1e-3) / (part.bf16_tflops * 1e12) if part else None}
    if ab_prefill and ad.model.config.model_type != "gpt2" and group.sp_norms:  # A/B: replicated norms
        group.sp_norms = False
        with torch.no_grad():
            ms_rep = _events_ms(lambda: model(ids, use_cache=False, logits_to_keep=1), cuda)
        group.sp_norms = True
        result["prefill_replicated_norms"] = {"ms": ms_rep, "tok_s": args.batch * args.prompt_len / ms_rep * 1e3}
        print(f"prefill with replicated RMSNorms: {ms_rep:.2f} ms (sequence-parallel: {ms:.2f} ms)")
    def prefill_ms():
        return _events_ms(lambda: model(ids, use_cache=False, logits_to_keep=1), cuda)

    if ab_prefill and ad.model.config.model_type != "gpt2" and group.seq_parallel and group._p2p is not None:
        # A/B: the sequence-parallel collectives on the copy engines vs NCCL
        ab = _flipped(group, "sp_p2p", ms, prefill_ms)
        result["prefill_sp_collectives"] = {k: {"ms": ab[v], "tok_s": args.batch * args.prompt_len / ab[v] * 1e3}
                                            for k, v in (("p2p", True), ("nccl", False))}
        print(f"prefill with the sequence-parallel collectives on the copy engines: {ab[True]:.2f} ms, "
              f"on NCCL: {ab[False]:.2f} ms")
    if ab_prefill and ad.model.config.model_type != "gpt2" and group.seq_parallel and group._p2p is not None \
            and group.sp_p2p:
        # A/B: the reduce-scatters' pulls overlapped with the row-parallel GEMMs, or after them
        ab = _flipped(group, "sp_overlap", ms, prefill_ms)
        result["prefill_sp_overlap"] = {k: {"ms": ab[v]} for k, v in (("on", True), ("off", False))}
        print(f"prefill with CUTE_KERNELS_TP_SP_OVERLAP=1: {ab[True]:.2f} ms, =0: {ab[False]:.2f} ms")
    if ab_prefill and ad.model.config.model_type != "gpt2":  # A/B: the sequence-parallel residual stream
        on = group.seq_parallel
        group.seq_parallel = not on
        with torch.no_grad():
            ms_other = _events_ms(lambda: model(ids, use_cache=False, logits_to_keep=1), cuda)
            breakdown = None if args.no_profile else profile_breakdown(
                lambda: model(ids, use_cache=False, logits_to_keep=1), cuda=cuda)
        group.seq_parallel = on
        ab = {on: {"ms": ms}, not on: {"ms": ms_other, "breakdown": breakdown}}
        result["prefill_seq_parallel"] = {
            k: {**v, "tok_s": args.batch * args.prompt_len / v["ms"] * 1e3} for k, v in
            (("on", ab[True]), ("off", ab[False]))}
        print(f"prefill with CUTE_KERNELS_TP_SEQ_PARALLEL=1: {ab[True]['ms']:.2f} ms, =0: {ab[False]['ms']:.2f} ms")
    if not args.no_profile:
        with torch.no_grad():
            result["prefill"]["breakdown"] = profile_breakdown(
                lambda: model(ids, use_cache=False, logits_to_keep=1), cuda=cuda)
    print(f"prefill {args.batch} x {args.prompt_len}: {ms:.2f} ms, {result['prefill']['tok_s']:,.0f} tokens/s"
          + (f", MFU {result['prefill']['mfu_pct']:.1f}% per rank" if part else ""))
    if cuda:
        torch.cuda.empty_cache()

    result["decode"] = {}
    auto = group.allreduce if group is not None else None  # what setup() picked for "auto"
    for allreduce in (allreduces if group is not None else ["none"]):
        if group is not None:
            if allreduce == "auto":
                allreduce = auto
            try:
                group.use(allreduce)
            except ValueError as e:
                print(f"skip decode with {allreduce}: {e}")
                continue
        row = {}
        try:
            dec = decoder_for(model, batch_size=1, max_len=args.decode_prompt_len + gen)
            try:
                dms = _decode_ms(dec, dec_ids, gen - 1, cuda)
            except RuntimeError as e:  # the capture failed here: time the same steps eagerly, and say so
                if not dec.cuda_graph:
                    raise
                row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                dec = decoder_for(model, batch_size=1, max_len=args.decode_prompt_len + gen)
                dec.cuda_graph = False
                dms = _decode_ms(dec, dec_ids, gen - 1, cuda)
            row.update({"ms_per_token": dms, "tok_s": 1e3 / dms, "cuda_graph": bool(dec.cuda_graph),
                        "decoder": type(dec).__name__})
            if part:
                ctx = args.decode_prompt_len + gen / 2
                step_bytes = decode_bytes(model, ad, 1, ctx)  # this rank's weights + KV rows
                emb = ad.token_embedding.weight
                if emb is not ad.lm_head.weight:  # an untied embedding is one row per step, not read whole
                    step_bytes -= emb.numel() * emb.element_size()
                row["roofline_ms"] = step_bytes / (part.hbm_tbps * 1e12) * 1e3
                row["mbu_pct"] = 100 * row["roofline_ms"] / dms
            dec.prefill(dec_ids)
            dec.decode(gen - 1)
            toks = dec.tokens(gen)
            row["tokens"] = toks[0].tolist()
            seq = torch.cat([dec_ids, toks], 1)
            row["margins"] = _teacher_forced(model, seq, args.decode_prompt_len)[1]
            if not args.no_profile and cuda and dec.cuda_graph and gen >= 9:  # where the step's time goes
                dec.prefill(dec_ids)
                row["timeline"] = decode_timeline(dec) or {}
            del dec
        except (RuntimeError, ValueError) as e:  # this backend fails here: say so, keep the rest
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if group is not None and cuda:
            row["allreduce_us"] = allreduce_us(group, ad.hidden, dtype, device)
            if allreduce == "push":  # a wait that gave up would have summed stale blocks
                row["push_wait_gave_up"] = group.push_gave_up()
        result["decode"][allreduce] = row
        shown = {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()
                 if k not in ("tokens", "margins")}
        print(f"decode b1 ({allreduce}): {shown}")
        if cuda:
            torch.cuda.empty_cache()
    if getattr(args, "tp_reference", None):
        mine = next((r["tokens"] for r in result["decode"].values() if "tokens" in r), None)
        result["teacher_forced_vs_reference"] = _agreement(model, dec_ids, args.tp_reference, mine)
        print(f"teacher-forced agreement with {args.tp_reference}: {result['teacher_forced_vs_reference']}")
    result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    result["wall_s"] = time.perf_counter() - t0
    out = Path(args.out) if args.out else Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    from benchmarks.common import gpu_tag

    tag = args.model.rstrip("/").split("/")[-1].lower()
    inv = f"_inv{result['tp_invariant']}" if result["tp_invariant"] else ""
    path = out / f"tp_{tag}_tp{size}{inv}_{gpu_tag() if cuda else 'cpu'}.json"
    if group is None or group.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")
    if group is not None:
        shutdown()
    return 0


__all__ = ["ALLREDUCES", "allreduce_us", "run_tp_bench"]
