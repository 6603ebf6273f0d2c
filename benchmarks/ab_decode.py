"""Same-run A/B of decode-step options that are chosen by environment variables.

    python -m benchmarks.ab_decode --model gpt2-xl \\
        base: fc:CUTE_KERNELS_DECODE_L2_PREFETCH=fc chain:CUTE_KERNELS_DECODE_L2_PREFETCH=chain

Each variant is `name:VAR=VAL[,VAR=VAL...]` (`name:` alone is the defaults). One model (random
weights, our kernels), one StaticDecoder per variant, each built and its CUDA graph captured
with its variables set, so options read when a decoder is built or when its step is captured
take effect (a variable read only at import does not). Then the variants' decode loops run in
turn, `--rounds` times, and each round's median ms/token is printed, with whether every
variant's greedy tokens equal the first one's.
"""

from __future__ import annotations

import argparse
import os

import torch


def _parse(spec: str) -> tuple[str, dict]:
    name, _, assigns = spec.partition(":")
    env = {}
    for a in filter(None, assigns.split(",")):
        var, eq, val = a.partition("=")
        if not eq or not var:
            raise SystemExit(f"bad variant {spec!r}: expected name:VAR=VAL[,VAR=VAL...]")
        env[var] = val
    return name or "base", env


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="name:VAR=VAL[,VAR=VAL...]")
    p.add_argument("--model", default="gpt2-xl")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ab_decode needs a CUDA GPU")

    from cute_kernels.gemm import gemv
    from inference.bench import _decode_ms
    from inference.decode import StaticDecoder
    from inference.models import load_config, load_model
    from inference.patch import patch_model

    variants = [_parse(v) for v in args.variants]
    cfg = load_config(args.model, random_weights=True)
    model = load_model(args.model, cfg, random_weights=True, device=torch.device("cuda"), dtype=torch.bfloat16)
    patch_model(model, precision=args.precision, attention="cute", backend="cute")
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), device="cuda")
    max_len = args.prompt_len + args.gen_len
    decoders = {}
    with torch.inference_mode():
        for name, env in variants:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            gemv._L2_PREFETCH.clear()  # hints are process-wide: each decoder registers its own
            try:
                dec = decoders[name] = StaticDecoder(model, batch_size=args.batch, max_len=max_len)
                dec.prefill(ids)
                dec.decode(1)  # captures the step's CUDA graph with these settings
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        gemv._L2_PREFETCH.clear()
        times: dict[str, list[float]] = {name: [] for name in decoders}
        for _ in range(args.rounds):
            for name, dec in decoders.items():
                times[name].append(_decode_ms(dec, ids, args.gen_len - 1, True))
        tokens = {name: dec.generate(ids, 32) for name, dec in decoders.items()}
    first = next(iter(tokens.values()))
    print(f"{args.model} {args.precision} batch {args.batch}, prompt {args.prompt_len} + {args.gen_len}: ms/token")
    for name, t in times.items():
        print(f"  {name:>10}: " + " ".join(f"{v:.4f}" for v in t) + f"   best {min(t):.4f}"
              + ("" if torch.equal(tokens[name], first) else "   (tokens differ from the first variant)"))


if __name__ == "__main__":
    main()
