"""Every runtime switch, declared once: name, default, effect.

All of them are read when the code they steer runs (a kernel call, a decoder's
construction, a cache lookup), never at import, so a test or a user can set them at any
time before that. `tests/test_env.py` fails if the code reads a CUTE_KERNELS_* variable
that is not declared here; README's "Runtime switches" table is generated from SWITCHES.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    default: str
    effect: str


SWITCHES: dict[str, Switch] = {
    "CUTE_KERNELS_CACHE_DIR": Switch(
        "", "Where compiled kernels are kept on disk, a subfolder per source hash and DSL version (unset: "
            "$XDG_CACHE_HOME/cute_kernels, else ~/.cache/cute_kernels)."),
    "CUTE_KERNELS_DISK_CACHE": Switch("1", "0: compiled kernels stay in memory only (every process compiles)."),
    "CUTE_KERNELS_TUNING": Switch(
        "1", "0: GEMM configs come from the heuristics alone (the tuning cache and the shipped tuning tables "
             "are not read)."),
    "CUTE_KERNELS_RECORD": Switch(
        "", "A manifest file: the kernels the process used are merged into it at exit (cute_kernels.precompile)."),
    "CUTE_KERNELS_GEMV": Switch(
        "1", "0: 16-bit GEMMs of at most 8 rows take the tiled GEMM instead of the skinny decode GEMVs."),
    "CUTE_KERNELS_GEMV_SM90": Switch(
        "1", "0: one-row GEMVs take the Triton skinny kernel instead of the CuTe DSL one-row kernel."),
    "CUTE_KERNELS_PDL": Switch(
        "1", "0: the Triton skinny GEMV launches without programmatic dependent launch (the CuTe DSL decode "
             "kernels always use it)."),
    "CUTE_KERNELS_DECODE_CLUSTER": Switch(
        "1", "0: split-KV decode attention merges its splits through global memory instead of inside a cluster."),
    "CUTE_KERNELS_DECODE_GLUE": Switch(
        "1", "0: the decode step's argmax and bookkeeping run as torch ops instead of one Triton launch."),
    "CUTE_KERNELS_LLAMA_QKV": Switch(
        "1", "0: the Llama-family decode step runs q, k and v as three GEMVs instead of one over the "
             "concatenated weights."),
    "CUTE_KERNELS_LLAMA_RMS_PROLOGUE": Switch(
        "1", "0: the Llama-family decode step runs each RMSNorm as transformers' module instead of in the prologue "
             "of the GEMV after it (Triton skinny GEMV, at most 8 rows; elsewhere one Triton launch)."),
    "CUTE_KERNELS_LLAMA_SWIGLU": Switch(
        "1", "0: the Llama-family decode step runs gate and up as one GEMV over the concatenated weights followed "
             "by silu(gate) * up as torch ops, instead of one Triton GEMV whose epilogue writes silu(gate) * up."),
    "CUTE_KERNELS_LLAMA_8BIT_DECODE": Switch(
        "1", "0: the Llama-family decode step of an 8-bit patched model (fp8 per-channel or int8, weight-only at "
             "decode sizes) runs its modules one by one instead of the 16-bit step's shortcuts: q/k/v and gate/up "
             "each one weight-only GEMV over the concatenated 8-bit weights and scales with the RMSNorm in its "
             "prologue (and the SwiGLU epilogue, CUTE_KERNELS_LLAMA_SWIGLU), RoPE + append in one launch."),
    "CUTE_KERNELS_LLAMA_ROPE_APPEND": Switch(
        "1", "0: the Llama-family decode step applies RoPE to q and k and appends k and v to the cache with torch "
             "ops instead of one Triton launch."),
    "CUTE_KERNELS_LLAMA_QKV_ROPE": Switch(
        "1", "0: the Llama-family decode step runs RoPE + append as its own launch after the q/k/v GEMV instead of in "
             "that GEMV's epilogue (with the RMSNorm prologue and CUTE_KERNELS_LLAMA_ROPE_APPEND on)."),
    "CUTE_KERNELS_LLAMA_PREFILL_RMSNORM": Switch(
        "1", "0: patch_model leaves the Llama family's RMSNorm modules to transformers' torch ops instead of one "
             "Triton launch each (16-bit CUDA inputs, eval mode; same two roundings)."),
    "CUTE_KERNELS_FP8_ATTENTION": Switch(
        "1", "0: patch_model's fp8 precision (attention='cute') keeps our bf16 attention kernel for long causal "
             "prefills instead of quantizing Q, K, V to e4m3 and running flash_attn_fp8 (head dim 128 from 4096 "
             "tokens, 64 from 8192; inference/ops.py FP8_ATTENTION_MIN_SEQLEN)."),
    "CUTE_KERNELS_LLAMA_PREFILL_ROPE": Switch(
        "1", "0: patch_model's Llama-family attention applies RoPE with transformers' apply_rotary_pos_emb instead "
             "of one Triton launch for q and k (transformers' bf16 roundings)."),
    "CUTE_KERNELS_LLAMA_PREFILL_SWIGLU": Switch(
        "1", "0: patch_model's Llama-family MLP runs transformers' gate, up, SiLU and product instead of one GEMM "
             "over the concatenated gate and up weights with silu(gate) * up in its epilogue; launch: that GEMM "
             "writes gate and up and silu * up is one Triton launch after it; split: the Triton silu * mul after "
             "the two separate GEMMs."),
    "CUTE_KERNELS_TRITON_DIRECT": Switch(
        "1", "0: Triton kernels always launch through Triton's JIT dispatch (no captured launcher)."),
    "CUTE_KERNELS_TP_ALLREDUCE": Switch(
        "auto", "Tensor parallelism's all-reduce: push (our one-kernel all-reduce over symmetric memory, "
                "inference/allreduce.py), one-shot or two-shot (PyTorch symmetric memory's kernels), each for messages "
                "up to 1 MiB with NCCL above, or nccl (dist.all_reduce) always; auto: push where symmetric memory and "
                "Triton are available, NCCL otherwise. 8 KB in a CUDA graph on 2x H200: push 5.0 us, NCCL 7.9."),
    "CUTE_KERNELS_TP_SP_NORM": Switch(
        "1", "0: with tensor parallelism, every rank runs the Llama family's RMSNorms over all rows (default: "
             "each rank normalizes its share of >= 1024 rows and an all-gather assembles them)."),
    "CUTE_KERNELS_TP_SEQ_PARALLEL": Switch(
        "1", "0: with tensor parallelism, the Llama family's prefill all-reduces a replicated residual stream "
             "(default: over >= 1024 rows the stream stays split by rows between decoder layers, a reduce-scatter "
             "and an all-gather per half-layer instead of an all-reduce)."),
    "CUTE_KERNELS_TP_SP_P2P": Switch(
        "1", "0: the sequence-parallel prefill's all-gathers and reduce-scatters run on NCCL (default: copy-engine "
             "pulls from symmetric memory where PyTorch provides it, inference/sp_collectives.py)."),
    "CUTE_KERNELS_TP_SP_OVERLAP": Switch(
        "1", "0: with the copy-engine collectives, each sequence-parallel reduce-scatter starts after the whole "
             "row-parallel GEMM (default: the rows the peers pull are computed first, then the copy engines pull "
             "while the GEMM computes this rank's own rows)."),
    "CUTE_KERNELS_TP_INVARIANT": Switch(
        "0", "P > 0: the Llama family's patched models run TP-invariant arithmetic (inference/invariant.py): each "
             "row-parallel K summed as P pieces in fp32 in a fixed order, one GEMM config per row count, attention "
             "unsplit, so TP=N computes TP=1's bits for every N dividing P and greedy tokens match (patch_model's "
             "tp_invariant=, --tp-invariant)."),
    "CUTE_KERNELS_RESULTS_DIR": Switch("", "Where the benchmark suites write their tables (unset: benchmarks/results)."),
}


def get(name: str) -> str:
    """The switch's value now (its declared default when unset)."""
    return os.environ.get(name, SWITCHES[name].default)


def enabled(name: str) -> bool:
    """For on/off switches: anything but "0" is on."""
    return get(name) != "0"


def markdown_table() -> str:
    rows = ["| variable | default | effect |", "|---|---|---|"]
    rows += [f"| `{n}` | {f'`{s.default}`' if s.default else 'unset'} | {s.effect} |" for n, s in SWITCHES.items()]
    return "\n".join(rows)
