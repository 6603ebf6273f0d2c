"""Tensor-parallel-invariant arithmetic: the Llama family computing the same bits at every TP
degree, so that TP=N greedy tokens are TP=1's, token for token.

Why the default is not invariant: a TP=N forward sums N bf16 partial products in each
row-parallel projection (o_proj, down_proj) where TP=1 keeps one fp32 sum, and the kernels pick
their configs by shape (GEMM tiles and split-K by N, the decode GEMVs by N and K, split-KV
attention by the head count), all of which a shard changes. A rounding that flips in the
residual stream reaches about one output in 32 of the next layer, so the runs drift apart within
a few layers and greedy decoding follows TP=1 only where the top-2 logit margin beats the
difference (docs/architecture.md).

The mode (`patch_model(..., tp_invariant=P)`, CUTE_KERNELS_TP_INVARIANT=P, `--tp-invariant P`;
patch_llama.set_tp_invariant marks the modules) makes every value independent of the degree:

- Every projection and the lm_head is one GEMM per call with a config that depends on the row
  count only (`gemm_config`; never split-K, a GEMV or a swapped launch), fp32 out. An
  element's sum then runs over K in one order whatever N is and wherever the element sits.
  Bias and residual are added to the fp32 sum afterwards, then it is rounded once.
- A row-parallel projection's K is summed as P pieces of K / P columns, in order: each piece's
  product in fp32; a sharded model's ranks hold P / N pieces each. On NCCL, with rows that split
  evenly, each rank receives every rank's pieces of its 1/N of the rows (all-to-all, fp32), adds
  them one after the other, rounds, and the rows are all-gathered. With one piece per rank and a
  message the push all-reduce takes (decode), that kernel adds the ranks' fp32 pieces in rank
  order itself. Otherwise (gloo) every rank all-gathers all pieces and adds them the same way.
  TP=1 computes the same P pieces on one GPU. P must be a multiple of every degree compared
  (P = 8 covers 1, 2, 4 and 8). A column-parallel projection without bias (pieces = 1) rounds
  in its GEMM's epilogue.
- Attention runs unsplit with the per-head-dim config (cute_kernels.flash_attn's invariant=):
  a head's result does not depend on how many heads the launch holds.
- Sequence parallelism, the sequence-parallel RMSNorms and the fused GEMV / GEMM epilogues
  (RMSNorm prologue, SwiGLU, RoPE in the q/k/v GEMV) are off. What stays (RMSNorm over whole
  rows, RoPE and the K/V append, silu(gate) * up, the vocabulary-parallel embedding, which adds
  zeros to the one owner's row, and the distributed argmax, which resolves ties to the lowest
  index as torch.argmax does) is row- or element-wise and the same at every degree already.

Cost, Llama-3-8B on 2x H200 (`benchmarks/results/tp_h200x2.md`, same machine): 2.1x the default
arithmetic's decode time and 1.2x (TP=1) / 1.3x (TP=2) its prefill time; TP=2 still runs at 1.60x
TP=1's prefill throughput and 0.59x its decode latency, and generates TP=1's tokens exactly.

Not covered: attention that leaves our kernels (a prompt longer than a sliding window, a padded
batch's explicit mask: SDPA), and invariance across batch shapes (a prefill and a decode step
take different GEMM tiles, so teacher-forcing a sequence may pick another token than generating
it at a near-tie, in every TP degree alike).

The reference backend (CPU) computes each piece in float64 and rounds it to fp32: products of
16- or 32-bit floats are exact in float64, and the order of a float64 sum moves it by about
2**-50 of its size, so the fp32 result does not depend on how BLAS blocks the product (barring a
2**-29 chance per element of landing on a rounding boundary).
"""

from __future__ import annotations

import torch

INVARIANT_ENV = "CUTE_KERNELS_TP_INVARIANT"


def pieces_from_env() -> int:
    """CUTE_KERNELS_TP_INVARIANT as an int (0: off); ValueError on anything else."""
    from cute_kernels.runtime import env

    raw = env.get(INVARIANT_ENV)
    try:
        pieces = int(raw)
    except ValueError:
        raise ValueError(f"{INVARIANT_ENV} must be an integer >= 0 (0: off), got {raw!r}") from None
    if pieces < 0:
        raise ValueError(f"{INVARIANT_ENV} must be an integer >= 0 (0: off), got {raw!r}")
    return pieces


# From this many rows on, the 128 x 256 tiles in clusters of 2 of the large GEMMs (a prefill).
WIDE_TILE_ROWS = 1024


def gemm_config(rows: int):
    """The GEMM config of every invariant-mode projection over `rows` rows: a function of the
    row count alone, which is the same at every TP degree (the replicated stream), where N is
    not. Up to 64 rows (decode) 64 x 64 tiles, one warpgroup, many CTAs streaming the weight
    (split-K by K // 1024 ranges, which would be allowed, measured slower: Llama-3-8B TP=1
    decode 10.08 vs 8.74 ms/token, 2x H200); 128 x 128 below WIDE_TILE_ROWS; 128 x 256 in
    clusters of 2 (the heuristic's large-GEMM tile) from there."""
    from cute_kernels.matmul.config import GemmConfig

    if rows <= 64:
        return GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1)
    if rows < WIDE_TILE_ROWS:
        return GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)
    return GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1)


def matmul(x2: torch.Tensor, w: torch.Tensor, backend: str, out_dtype=torch.float32, out=None) -> torch.Tensor:
    """x2 [M, K] @ w [N, K].T in out_dtype (fp32, or x2's dtype: the fp32 sum rounded once),
    the same bits for any N and any strides (see the module docstring); written into `out`
    when given."""
    if backend == "reference":
        y = (x2.double() @ w.double().t()).float().to(out_dtype)
        return y if out is None else out.copy_(y)
    from cute_kernels.matmul.api import gemm

    return gemm(x2, w.t(), out_dtype=out_dtype, out=out, config=gemm_config(x2.shape[0]))


def _ordered_sum(parts, bias, residual, dtype) -> torch.Tensor:
    """((((0 + parts[0]) + parts[1]) + ...) + bias) + residual in fp32, rounded to dtype once. The
    sum starts from +0.0 as the push all-reduce's does (TPGroup.ordered_sum), so that a -0.0
    partial is +0.0 in both."""
    acc = parts[0] + 0.0
    for p in parts[1:]:
        acc += p
    if bias is not None:
        acc += bias.float()
    if residual is not None:
        acc += residual.float()
    return acc.to(dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, residual=None, *, pieces: int = 1, tp=None,
           backend: str = "cute") -> torch.Tensor:
    """x @ weight.T + bias + residual in x's dtype, one rounding of an fp32 sum. `pieces`: the
    full K's pieces, summed in order; tp: the TPGroup of a row-parallel projection (weight and x
    hold this rank's pieces; the bias and the residual are whole, added on every rank)."""
    K, N = x.shape[-1], weight.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    size = 1 if tp is None else tp.size
    local = pieces // size
    if local < 1 or pieces % size or K % local:
        raise ValueError(f"{pieces} pieces of K do not split over {size} ranks of {K} columns each")
    step = K // local
    M = x2.shape[0]
    if pieces == 1 and bias is None and residual is None:  # a column-parallel projection: one GEMM, rounded in it
        return matmul(x2, weight, backend, x.dtype).view(*lead, N)
    parts = torch.empty((local, M, N), dtype=torch.float32, device=x.device)  # each piece's GEMM writes its slice
    for i in range(local):
        matmul(x2[:, i * step:(i + 1) * step], weight[:, i * step:(i + 1) * step], backend, out=parts[i])
    r2 = None if residual is None else residual.reshape(M, N)
    if tp is None or size == 1:
        return _ordered_sum(list(parts.unbind(0)), bias, r2, x.dtype).view(*lead, N)
    if local == 1:
        summed = tp.ordered_sum(parts[0])  # our push all-reduce: rank order from +0.0, in fp32
        if summed is not None:
            return _ordered_sum([summed], bias, r2, x.dtype).view(*lead, N)
    if tp.comm_backend == "nccl" and M % size == 0 and not torch.cuda.is_current_stream_capturing():
        # Each rank sums its 1/size of the rows: every rank's pieces of those rows arrive in rank
        # order (all-to-all, fp32), then the rounded rows are all-gathered (bf16). Half the bytes
        # of all-gathering every piece at 2 ranks, and 1/size of the adds.
        n = M // size
        send = parts.view(local, size, n, N).transpose(0, 1).contiguous()  # [dest rank, local, n, N]
        recv = torch.empty_like(send)  # [source rank, local, n, N]
        import torch.distributed as dist

        dist.all_to_all_single(recv, send, group=tp.group)
        mine = None if r2 is None else r2[tp.rank * n:(tp.rank + 1) * n]
        rows = _ordered_sum(list(recv.view(pieces, n, N).unbind(0)), bias, mine, x.dtype)
        return tp.all_gather(rows).view(*lead, N)
    gathered = tp.all_gather(parts).view(pieces, M, N)  # rank order: the pieces in order
    return _ordered_sum(list(gathered.unbind(0)), bias, r2, x.dtype).view(*lead, N)


__all__ = ["INVARIANT_ENV", "gemm_config", "linear", "matmul", "pieces_from_env"]
