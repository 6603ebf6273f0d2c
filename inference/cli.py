"""`python -m inference generate|bench`: argument handling and the generate command.

Bad input (unknown model, too many positions, a precision/backend this machine
cannot run) ends with one `error: ...` line and exit status 2, never a
traceback; set INFERENCE_DEBUG=1 to see the traceback anyway. Arguments are
validated before torch/transformers are imported, so typos fail fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .device import resolve_device
from .models import GPT2_SIZES, LLAMA_CONFIGS, PRECISIONS, RANDOM_BANNER, UserError, check_positions

BACKENDS = ("cute", "cublas", "compile", "tensorrt")
ALLREDUCES = ("auto", "nccl", "one-shot", "two-shot", "push")  # inference.tp.ALLREDUCES (not imported: no torch here)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + message; we want one line
        self.exit(2, f"error: {message}\n")


def _csv(choices):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r} not in {', '.join(choices)}")
        return items

    return parse


def _ints(text):
    try:
        items = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m inference",
                description="GPT-2 and Llama-family models on cute_kernels: generate text or benchmark.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp):
        sp.add_argument("--model", required=True,
                        help=f"hub name or local directory ({', '.join((*GPT2_SIZES, *LLAMA_CONFIGS))})")
        sp.add_argument("--random-weights", action="store_true",
                        help="use random weights of a known model shape (no download)")
        sp.add_argument("--attention", choices=("cute", "sdpa"), default="cute",
                        help="attention of the patched model: ours (default) or PyTorch SDPA (cuDNN / flash)")
        sp.add_argument("--tune", action="store_true",
                        help="first tune the GEMM configs of the model's linears at this run's row counts on this "
                             "GPU (cute_kernels.tune; kept in the tuning cache for later runs)")
        sp.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="cpu: the PyTorch references on the CPU (checks the pipeline; no meaningful speed). "
                             "Default: cuda, or cpu where there is no GPU and the backend is the reference")
        sp.add_argument("--tp", type=int, default=None,
                        help="tensor parallelism over N processes: launch with torchrun --nproc-per-node N "
                             "(bf16, our kernels; only rank 0 prints)")
        sp.add_argument("--allreduce", type=_csv(ALLREDUCES), default=None,
                        help=f"with --tp: the all-reduce backend, from {','.join(ALLREDUCES)} (default: "
                             "CUTE_KERNELS_TP_ALLREDUCE, else auto); bench takes a comma-separated list to compare")
        sp.add_argument("--tp-invariant", type=int, default=None, metavar="P",
                        help="with --tp (1 too): TP-invariant arithmetic, each row-parallel K summed as P pieces in "
                             "a fixed order (inference/invariant.py; the Llama family): runs at every TP degree "
                             "dividing P give the same tokens. 0: off (default: CUTE_KERNELS_TP_INVARIANT)")

    g = sub.add_parser("generate", help="greedy generation with the patched model")
    common(g)
    g.add_argument("--prompt", default="The meaning of life is")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--precision", choices=PRECISIONS, default="bf16")
    g.add_argument("--backend", choices=("cute", "reference"), default="cute",
                   help="reference = the PyTorch references of our kernels (implied by --device cpu)")
    g.add_argument("--no-compare", action="store_true", help="skip the comparison with the unpatched model")
    g.set_defaults(func=run_generate)

    b = sub.add_parser("bench", help="prefill/decode benchmark across backends and precisions")
    common(b)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--prompt-len", type=int, default=1024)
    b.add_argument("--gen-len", type=int, default=128, help="decode steps to time (0: prefill only)")
    b.add_argument("--backends", type=_csv(BACKENDS), default=list(BACKENDS),
                   help=f"comma-separated, from {','.join(BACKENDS)}")
    b.add_argument("--precisions", type=_csv(PRECISIONS), default=["bf16", "fp8", "int8"],
                   help=f"comma-separated, from {','.join(PRECISIONS)}")
    b.add_argument("--decode-batch", type=_ints, default=None,
                   help="decode at each of these batch sizes (e.g. 1,8,32) with prompts of --decode-prompt-len, "
                        "one report per phase and batch (default: decode at --batch after the --batch prefill)")
    b.add_argument("--decode-prompt-len", type=int, default=None, help="prompt length of the decode runs "
                   "(default --prompt-len; with --tp: 128, also the greedy-token check's prompt)")
    b.add_argument("--compile-decode-batch", type=_ints, default=None,
                   help="decode batches the compile backend runs (default all; torch.compile of a large model "
                        "takes minutes per shape)")
    b.add_argument("--out", default=None, help="report directory (default benchmarks/results)")
    b.add_argument("--no-profile", action="store_true", help="skip the torch.profiler per-op breakdown")
    b.add_argument("--tp-reference", default=None,
                   help="with --tp: the results file of another TP degree's run (same model and prompt): its "
                        "greedy tokens are teacher-forced through this model and the agreement reported")
    b.set_defaults(func=_run_bench)
    return p


def _run_bench(args) -> int:
    if args.tp is not None:
        from .tp_bench import run_tp_bench

        return run_tp_bench(args)
    from .bench import run_bench

    return run_bench(args)


def _launch_problem(args) -> str | None:
    """What is wrong with --tp for this launch (read from torchrun's environment, before any import)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.tp is None:
        return f"launched as {world} processes: pass --tp {world}" if world > 1 else None
    if args.tp < 1:
        return "--tp must be >= 1"
    if args.tp != world:
        return (f"--tp {args.tp} needs torchrun --nproc-per-node {args.tp} (this launch has WORLD_SIZE={world})"
                if world == 1 else f"--tp {args.tp} but torchrun started {world} processes (WORLD_SIZE={world})")
    if getattr(args, "precision", "bf16") != "bf16" or getattr(args, "backend", "cute") not in ("cute", "reference"):
        return "--tp runs the bf16 patched model (--precision bf16)"
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("max_new_tokens", "batch", "prompt_len"):
        if getattr(args, flag, 1) < 1:
            return _fail(f"--{flag.replace('_', '-')} must be >= 1")
    if getattr(args, "gen_len", 0) < 0:
        return _fail("--gen-len must be >= 0 (0: prefill only)")
    problem = _launch_problem(args)
    if problem:
        return _fail(problem)
    if args.allreduce is not None and args.tp is None:
        return _fail("--allreduce goes with --tp")
    if args.tp_invariant is not None and (args.tp is None or args.tp_invariant < 0):
        return _fail("--tp-invariant P (P >= 0) goes with --tp (--tp 1 for the unsharded run)")
    if _rank() != 0:  # only rank 0 prints; errors still reach stderr
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    try:
        return args.func(args)
    except (UserError, NotImplementedError, ValueError, ImportError, OSError) as e:
        if os.environ.get("INFERENCE_DEBUG"):
            raise
        return _fail(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, every_rank=True)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _fail(msg: str, every_rank: bool = False) -> int:
    """One line on stderr: from rank 0, or from every rank (prefixed) for errors a rank hit alone."""
    rank = _rank()
    if rank == 0 or every_rank:
        print(f"error: {msg}" if rank == 0 else f"error (rank {rank}): {msg}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- shared helpers


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- generate


class _Phases:
    """Wall time per startup phase, printed as one line: where a cold or warm start goes."""

    def __init__(self):
        self.t = time.perf_counter()
        self.parts: list[tuple[str, float]] = []

    def __call__(self, name: str):
        now = time.perf_counter()
        self.parts.append((name, now - self.t))
        self.t = now

    def line(self) -> str:
        total = sum(s for _, s in self.parts)
        return f"wall {total:.1f} s: " + ", ".join(f"{n} {s:.1f}" for n, s in self.parts)


def manifest_name(model: str, precision: str) -> str | None:
    """The shipped kernel manifest (cute_kernels/manifests) for a model name or a local
    checkpoint directory of a known size, at this precision. Reads config.json directly:
    it runs before transformers is imported."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from .models import size_name, size_of

    cfg = Path(model) / "config.json"
    if cfg.is_file():
        try:
            size = size_of(SimpleNamespace(**json.loads(cfg.read_text())))
        except (OSError, ValueError, TypeError):
            size = None
    else:
        size = size_name(model)
    return f"{size}-{precision}" if size else None


def _start_precompile(args):
    """(thread, stats): replays the model's shipped manifest (cute_kernels.precompile) in a
    background thread; stats fills in when the thread ends. None without a manifest."""
    import threading

    from cute_kernels.precompile import ensure_manifest, manifest_path

    name = manifest_name(args.model, args.precision)
    if name is None or not manifest_path(name).exists():
        return None
    stats: dict = {}

    def run():
        try:
            # Half the cores: the other half keep importing and building the model meanwhile.
            stats.update(ensure_manifest(name, jobs=max(1, (os.cpu_count() or 2) // 2), load=True) or {})
        except Exception as e:  # noqa: BLE001 - the kernels then compile on first use, as without a manifest
            stats["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, stats


def run_generate(args) -> int:
    phases = _Phases()
    import copy

    import torch

    device = resolve_device(args)
    group = _tp_group(args, device)
    if group is not None:
        device = torch.device(device.type, torch.cuda.current_device()) if device.type == "cuda" else device
    # The model's kernels build in worker processes while this one imports and loads the model.
    precompiling = _start_precompile(args) if args.backend == "cute" else None
    import transformers

    from .decode import StaticDecoder
    from .decoders import decoder_for
    from .models import load_config, load_tokenizer
    from .patch import patch_model

    phases("imports")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    transformers.utils.logging.disable_progress_bar()

    config = load_config(args.model, random_weights=args.random_weights)
    tokenizer, tok_note = load_tokenizer(args.model)
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise UserError("the prompt encodes to zero tokens")
    check_positions(config, len(prompt_ids), args.max_new_tokens)
    if max(prompt_ids) >= config.vocab_size:
        raise UserError(f"the tokenizer produced id {max(prompt_ids)} >= vocab size {config.vocab_size}")

    if args.random_weights:
        print(RANDOM_BANNER.format(name=args.model))
    if tok_note:
        print(f"note: {tok_note}")
    model = _load(args, config, device, dtype, group)
    ids = torch.tensor([prompt_ids], device=device)
    calibration = [ids] if args.precision == "int8-smoothquant" else None
    # unpatched, for the agreement check (a sharded model has no unsharded twin in this process)
    reference = None if args.no_compare or group is not None else copy.deepcopy(model)
    phases("model")
    if args.tune:
        if device.type == "cuda" and args.backend == "cute":
            from .models import tune_linears

            print(tune_linears(args.model, config, [args.precision], [len(prompt_ids), 1]))
            phases("tune")
        else:
            print("note: --tune times kernels on the GPU: nothing tuned for the reference backend")
    kernels_note = ""
    if precompiling is not None:
        thread, stats = precompiling
        thread.join()
        ahead = [f"{stats[k]} {what}" for k, what in (("compiled", "kernels"), ("triton_compiled", "Triton kernels"))
                 if stats.get(k)]
        if ahead:
            kernels_note = f"{' and '.join(ahead)} compiled in parallel ({stats['wall_s']:.1f} s)"
        if stats.get("error"):
            print(f"note: building the model's kernels ahead failed ({stats['error']}); they compile on first use")
        phases("kernels")
    patch_model(model, precision=args.precision, attention=args.attention, backend=args.backend,
                calibration=calibration, tp=group, tp_invariant=args.tp_invariant)
    if group is not None:
        group.setup(device, dtype)  # collective; before any CUDA graph captures an all-reduce
    dev_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    tp_note = f" tp={group.size} allreduce={group.allreduce}" if group is not None else ""
    print(f"model={args.model} precision={args.precision} attention={args.attention} backend={args.backend} "
          f"device={dev_name} dtype={str(dtype).replace('torch.', '')}{tp_note}")

    n = args.max_new_tokens
    decoder = decoder_for(model, batch_size=1, max_len=len(prompt_ids) + n)
    if decoder.cuda_graph:  # first call captures the graph and loads kernels: keep it out of the timing
        decoder.generate(ids, min(n, 2))
    _sync(device)
    phases("first step")
    t0 = time.perf_counter()
    decoder.prefill(ids)
    _sync(device)
    t1 = time.perf_counter()
    decoder.decode(n - 1)
    _sync(device)
    t2 = time.perf_counter()
    tokens = decoder.tokens(n)[0].tolist()
    phases("generate")

    print("--- text ---")
    print(args.prompt + tokenizer.decode(tokens))
    print("--- speed ---")
    decode_rate = (n - 1) / (t2 - t1) if n > 1 else float("nan")
    if decoder.cuda_graph:
        how = "one CUDA graph per token"
    elif isinstance(decoder, StaticDecoder):
        how = "eager"
    else:
        how = "eager: one forward of the patched model per token with transformers' cache, not one CUDA graph per token"
    print(f"prefill {len(prompt_ids)} tokens: {1e3 * (t1 - t0):.2f} ms; decode {n - 1} tokens: "
          f"{1e3 * (t2 - t1):.2f} ms = {decode_rate:.1f} tokens/s ({how}); "
          f"end to end {n / (t2 - t0):.1f} tokens/s")

    if reference is not None:
        print("--- agreement with the unpatched model ---")
        # One teacher-forced forward of the unpatched model over prompt + our tokens: where its
        # argmax equals our next token at every position, its own greedy generation is ours.
        full = torch.cat([ids[0], torch.tensor(tokens, device=device)]).unsqueeze(0)
        with torch.no_grad():
            lr = reference(full, use_cache=False).logits[0, len(prompt_ids) - 1:-1].float()
            lo = model(full, use_cache=False).logits[0, len(prompt_ids) - 1:-1].float()
        agree = (lr.argmax(-1) == full[0, len(prompt_ids):])
        first = int((~agree).nonzero()[0]) if not bool(agree.all()) else None
        print(f"greedy tokens: the unpatched model picks the same token at {int(agree.sum())}/{n} positions "
              f"(first divergence: {'none' if first is None else f'token {first}'}); "
              f"max |logit diff| {float((lr - lo).abs().max()):.4g} (max |logit| {float(lr.abs().max()):.3g})")
        phases("compare")
    if args.backend == "cute":
        from cute_kernels.runtime import KERNELS

        st = KERNELS.stats
        kernels_note = "; ".join(x for x in (kernels_note, f"kernels in this process: {st['disk_loads']} loaded from "
                                             f"the disk cache ({st['load_s']:.1f} s), {st['compiles']} compiled "
                                             f"({st['compile_s']:.1f} s)") if x)
    print(f"--- startup ---\n{phases.line()}" + (f"; {kernels_note}" if kernels_note else ""))
    if group is not None:
        from .tp import shutdown

        shutdown()
    return 0


def _tp_group(args, device):
    """The TPGroup of a --tp N > 1 launch (process group initialized here), else None."""
    if not args.tp or args.tp == 1:
        return None
    from .tp import init_tp

    return init_tp(args.tp, args.allreduce[0] if args.allreduce else None)


def _load(args, config, device, dtype, group):
    """The model: with --tp, random weights built sharded for the group (the same model for every
    TP degree); otherwise loaded whole (patch_model shards it)."""
    from .models import load_model

    if args.tp and args.random_weights:
        from .tp import build_random

        return build_random(config, device=device, dtype=dtype, tp=group)
    return load_model(args.model, config, random_weights=args.random_weights, device=device, dtype=dtype)
