"""A/B of the Llama-family decode fusions (inference/decode_llama.py), same model, same run.

    python -m benchmarks.llama_fusions --model llama-3-8b --random-weights --batch 1
    python -m benchmarks.llama_fusions --model llama-3-8b --random-weights --batch 4 --prompt-len 2048 --prefill

Loads and patches the model once, then builds one LlamaStaticDecoder per setting (the
switches are read when a decoder is built) and times its CUDA-graph decode: every fusion on,
each one turned off alone, and all off. Writes llama_fusions_<model>_b<batch>_<gpu>.{json,md}
to --out (default benchmarks/results).

--prefill times the patched model's prefill forward instead (CUDA-graph replays, as the
inference bench times it), over the prefill fusions (patch_llama.set_prefill_fusions flips
them in place): all off, each one on alone, SwiGLU as a launch after the [gate; up] GEMM and
after two GEMMs, all on with the SwiGLU launch, all on; writes llama_prefill_fusions_<...>.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

ALL_ON = {"CUTE_KERNELS_LLAMA_QKV": "1", "CUTE_KERNELS_LLAMA_RMS_PROLOGUE": "1", "CUTE_KERNELS_LLAMA_SWIGLU": "1",
          "CUTE_KERNELS_LLAMA_ROPE_APPEND": "1", "CUTE_KERNELS_LLAMA_QKV_ROPE": "1", "CUTE_KERNELS_DECODE_GLUE": "1"}
PREFILL_OFF = {"rmsnorm": False, "rope": False, "swiglu": False}
PREFILL_SETTINGS = {"all off": PREFILL_OFF, **{f"{k} on": {**PREFILL_OFF, k: True} for k in PREFILL_OFF},
                    "swiglu launch on": {**PREFILL_OFF, "swiglu": "launch"},
                    "swiglu split on": {**PREFILL_OFF, "swiglu": "split"},
                    "all on, swiglu launch": {**{k: True for k in PREFILL_OFF}, "swiglu": "launch"},
                    "all on": {k: True for k in PREFILL_OFF}}
# The one-row DSL GEMV (matmul/gemv.py) against the Triton GEMV for the shapes it takes (o_proj, lm_head).
GEMV_SM90 = "CUTE_KERNELS_GEMV_SM90"
SETTINGS = {"all on": {}, **{f"{name} = 0": {name: "0"} for name in ALL_ON},
            "all off": {name: "0" for name in ALL_ON}, "defaults": None,
            f"defaults; {GEMV_SM90} = 0": {GEMV_SM90: "0"}}
SWITCHES = (*ALL_ON, GEMV_SM90)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--out", default=None)
    p.add_argument("--prefill", action="store_true", help="A/B the prefill fusions (patch_llama.set_prefill_fusions)")
    p.add_argument("--settings", default=None, help="comma-separated setting labels to time (default: all)")
    args = p.parse_args(argv)
    from inference.bench import _decode_ms
    from inference.decode_llama import LlamaStaticDecoder
    from inference.models import load_config, load_model
    from inference.patch import patch_model

    if not torch.cuda.is_available():
        print("error: llama_fusions needs a CUDA GPU")
        return 2
    cfg = load_config(args.model, random_weights=args.random_weights)
    model = load_model(args.model, cfg, random_weights=args.random_weights, device=torch.device("cuda"),
                       dtype=torch.bfloat16)
    patch_model(model, precision="bf16", attention="cute", backend="cute")
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), device="cuda")
    if args.prefill:
        return _prefill_ab(model, ids, args)
    wanted = SETTINGS if args.settings is None else {k: SETTINGS[k] for k in args.settings.split(",")}
    rows, saved = [], {name: os.environ.get(name) for name in SWITCHES}
    for label, setting in wanted.items():
        for name in SWITCHES:  # defaults: every switch unset
            os.environ.pop(name, None)
        if setting is None:
            pass
        elif label.startswith("defaults"):
            os.environ.update(setting)
        else:
            os.environ.update({**ALL_ON, **setting})
        dec = None
        try:
            with torch.inference_mode():
                dec = LlamaStaticDecoder(model, batch_size=args.batch, max_len=args.prompt_len + args.gen_len)
                ms = _decode_ms(dec, ids, args.gen_len - 1, True)
                tokens = dec.generate(ids, args.gen_len)
            rows.append({"setting": label, "ms_per_token": ms, "tok_s": args.batch / ms * 1e3,
                         "tokens": tokens[0, :16].tolist()})
        except Exception as e:  # noqa: BLE001 - one broken setting must not hide the others
            rows.append({"setting": label, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        print(rows[-1], flush=True)
        del dec
        torch.cuda.empty_cache()
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
    base = next((r["ms_per_token"] for r in rows if r["setting"] == "all on" and "ms_per_token" in r),
                next((r["ms_per_token"] for r in rows if "ms_per_token" in r), None))
    return _write(args, "llama_fusions", f"b{args.batch}", {"gen_len": args.gen_len}, rows, [
        "Llama-family decode fusions",
        f"batch {args.batch}, prompt {args.prompt_len}, {args.gen_len} tokens; one CUDA graph per token; "
        "\"all on\" turns every fusion on, each other row turns one off (same process, same weights); "
        "rows are relative to \"all on\", else to the first row timed.",
        "| setting | ms/token | tokens/s | vs all on | first tokens |"],
        lambda r: f"{r['ms_per_token']:.3f} | {r['tok_s']:,.0f} | {_rel(r['ms_per_token'], base)} | {r['tokens'][:8]}")


def _prefill_ab(model, ids, args) -> int:
    from inference.bench import _time_ms
    from inference.patch_llama import set_prefill_fusions

    rows, ref = [], None
    for label, setting in PREFILL_SETTINGS.items():
        set_prefill_fusions(model, **setting)
        try:
            with torch.inference_mode():
                logits = model(ids, use_cache=False).logits[:, -1].float()
                ms = _time_ms(lambda: model(ids, use_cache=False).logits, True)
            ref = logits if ref is None else ref
            rows.append({"setting": label, "ms": ms, "tok_s": ids.numel() / ms * 1e3,
                         "max_logit_diff_vs_all_off": float((logits - ref).abs().max())})
        except Exception as e:  # noqa: BLE001 - one broken setting must not hide the others
            rows.append({"setting": label, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        print(rows[-1], flush=True)
    base = rows[0].get("ms")
    return _write(args, "llama_prefill_fusions", f"b{args.batch}x{args.prompt_len}", {}, rows, [
        "Llama-family prefill fusions",
        f"prefill {args.batch}x{args.prompt_len}, forward of the patched model timed as CUDA-graph replays "
        "(backend cute, attention cute); each row sets the fusions in place on the same weights.",
        "| setting | ms | tokens/s | vs all off | max last-token logit diff vs all off |"],
        lambda r: f"{r['ms']:.2f} | {r['tok_s']:,.0f} | {_rel(r['ms'], base)} | {r['max_logit_diff_vs_all_off']:.3g}")


def _rel(ms: float, base: float | None) -> str:
    return f"{ms / base:.3f}x" if base else "-"


def _write(args, name: str, shape_tag: str, meta_extra: dict, rows: list, head: list, cells) -> int:
    """{name}_{model}_{shape_tag}_{gpu}.{json,md} under --out; head: title, one caption line and the
    table's header row (five columns); cells(row): the last four cells of a row without an error."""
    from benchmarks.common import gpu_name, gpu_tag
    from inference.models import llama_name

    tag = llama_name(args.model) or Path(args.model).name
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}_{tag}_{shape_tag}_{gpu_tag()}"
    meta = {"model": args.model, "gpu": gpu_name(), "date": datetime.date.today().isoformat(), "batch": args.batch,
            "prompt_len": args.prompt_len, **meta_extra, "torch": torch.__version__}
    Path(f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    md = [f"# {head[0]}: {args.model} on {meta['gpu']} ({meta['date']})", "", head[1], "", head[2],
          "|---|---|---|---|---|"]
    md += [f"| {r['setting']} | - | - | - | {r['error']} |" if "error" in r else f"| {r['setting']} | {cells(r)} |"
           for r in rows]
    Path(f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
