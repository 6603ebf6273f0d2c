"""The decode step's glue as one launch: greedy token, bookkeeping, next step's embedding.

Between the lm_head of step t and the first GEMV of step t + 1 the plain loop runs about
ten small torch kernels: argmax over the 50257 logits (one reduction block: 16 us on the
H100), writing the token into the output and the input buffer, two embedding gathers
and their sum, the position and step increments, the attention lengths. Each costs its
launch and its own round trips, and none takes part in programmatic dependent launch,
so the first GEMV of the next step cannot start its weight copies early. Here one
Triton launch does all of it (CHUNKS programs per sequence reduce slices of the logits;
the last of them to finish does the rest for its sequence):

    tok[b]        = argmax(logits[b, :V])  (first maximal index, as torch.argmax)
    out[b, step]  = tok[b]
    h[b, :]       = wte[tok[b]] + wpe[pos + 1]   (bf16 sum, as the unfused add rounds it;
                                                  wte[tok[b]] alone where wpe is None: RoPE models)
    seqlens[b]    = pos + 2                      (keys the next step attends to)

and the last sequence to finish (an acq_rel ticket counter, reset by that program) moves
pos and step on by one, after every sequence has read them.

`next_token_reference` is the same in torch (CPU tests, and the check on the GPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton: the reference path still works
    triton = tl = None


def next_token_reference(logits, wte, wpe, tok, out, pos, step, h, seqlens) -> None:
    """The glue in torch: logits [B, >= V] rows (V = wte.shape[0]), in-place updates."""
    V = wte.shape[0]
    nxt = logits[:, :V].argmax(-1)  # [B]
    out[:, step] = nxt.view(-1, 1)
    tok.copy_(nxt.view(-1, 1))
    h.copy_((wte[nxt] if wpe is None else wte[nxt] + wpe[pos + 1]).view(h.shape))
    seqlens.copy_((pos + 2).to(torch.int32).expand(seqlens.shape[0]))
    pos.add_(1)
    step.add_(1)


# Vocabulary chunks per sequence: one program each reduces its chunk, the last one of a row
# folds the chunk maxima (one program over all 50257 logits took 15 us of the 16 us that
# torch's argmax took; the rest of the glue costs little).
CHUNKS = 32


def next_token_buffers(batch: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scratch for next_token at fixed addresses (CUDA graphs): chunk maxima [B, CHUNKS] fp32
    and their indices (int32), and B + 1 ticket counters (one per row, one for the batch), 0."""
    return (torch.empty(batch, CHUNKS, dtype=torch.float32, device=device),
            torch.empty(batch, CHUNKS, dtype=torch.int32, device=device),
            torch.zeros(batch + 1, dtype=torch.int32, device=device))


if triton is not None:

    @triton.jit
    def _next_token_kernel(logits_ptr, l_stride, V, CH, wte_ptr, wpe_ptr, E, h_ptr, h_stride, tok_ptr, out_ptr,
                           out_stride, pos_ptr, step_ptr, seqlens_ptr, part_v_ptr, part_i_ptr, ticket_ptr, B,
                           CHUNKS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_E: tl.constexpr, PDL: tl.constexpr,
                           HAS_WPE: tl.constexpr = True):
        b = tl.program_id(0)
        c = tl.program_id(1)
        if PDL:
            # Everything read here (logits, counters) is written by earlier kernels; the
            # kernel after this one (the next step's first projection) reads only its
            # weights before its own wait, so it may launch at once.
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        offs = c * CH + tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + b.to(tl.int64) * l_stride + offs, mask=(offs < V) & (offs < (c + 1) * CH),
                    other=float("-inf")).to(tl.float32)
        tl.store(part_v_ptr + b * CHUNKS + c, tl.max(x, 0))
        tl.store(part_i_ptr + b * CHUNKS + c, c * CH + tl.argmax(x, 0, tie_break_left=True))
        # Release this chunk's maximum; the row's last program acquires all of them.
        t = tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel")
        if t == CHUNKS - 1:
            tl.store(ticket_ptr + b, 0)
            cs = tl.arange(0, CHUNKS)
            pv = tl.load(part_v_ptr + b * CHUNKS + cs)
            pi = tl.load(part_i_ptr + b * CHUNKS + cs)
            # Chunks are in index order: the first maximal chunk holds the first maximal index.
            tok = tl.sum(tl.where(cs == tl.argmax(pv, 0, tie_break_left=True), pi, 0), 0).to(tl.int64)
            pos = tl.load(pos_ptr)
            step = tl.load(step_ptr)
            tl.store(tok_ptr + b, tok)
            tl.store(out_ptr + b.to(tl.int64) * out_stride + step, tok)
            e = tl.arange(0, BLOCK_E)
            for e0 in range(0, E, BLOCK_E):
                me = e0 + e < E
                w = tl.load(wte_ptr + tok * E + e0 + e, mask=me, other=0.0)
                if HAS_WPE:
                    p = tl.load(wpe_ptr + (pos + 1) * E + e0 + e, mask=me, other=0.0).to(tl.float32)
                    w = w.to(tl.float32) + p
                tl.store(h_ptr + b.to(tl.int64) * h_stride + e0 + e, w.to(h_ptr.dtype.element_ty), mask=me)
            tl.store(seqlens_ptr + b, (pos + 2).to(tl.int32))
            # The batch's last row moves the shared counters on, after every row read them.
            t2 = tl.atomic_add(ticket_ptr + B, 1, sem="acq_rel")
            last = t2 == B - 1
            tl.store(pos_ptr, pos + 1, mask=last)
            tl.store(step_ptr, step + 1, mask=last)
            tl.store(ticket_ptr + B, 0, mask=last)


def next_token(logits, wte, wpe, tok, out, pos, step, h, seqlens, buffers) -> None:
    """One launch of the glue (see the module docstring) on CUDA tensors:

    logits [B, >= V] (unit stride on the vocabulary), wte [V, E] and wpe [P, E] (or None) contiguous,
    tok [B, 1] and out [B, max_len] int64, pos and step int64 [1], h [B, 1, E] in wte's
    dtype, seqlens int32 [B], buffers from next_token_buffers(B) (tickets left at 0)."""
    from cute_kernels.matmul.gemv import pdl_enabled, prefer_max_shared

    B = logits.shape[0]
    V, E = wte.shape
    if not (wte.is_contiguous() and (wpe is None or wpe.is_contiguous()) and logits.stride(-1) == 1
            and h.stride(-1) == 1):
        raise ValueError("next_token: wte, wpe must be contiguous and logits, h unit-stride rows")
    part_v, part_i, tickets = buffers
    if part_v.shape != (B, CHUNKS) or tickets.numel() != B + 1:
        raise ValueError(f"next_token: buffers are for another batch size (expected {B})")
    ch = triton.cdiv(V, CHUNKS)
    pdl = pdl_enabled()
    kw = {"launch_pdl": True} if pdl else {}
    kernel = _next_token_kernel[(B, CHUNKS)](
        logits, logits.stride(0), V, ch, wte, wte if wpe is None else wpe, E, h, h.stride(0), tok, out, out.stride(0), pos, step, seqlens,
        part_v, part_i, tickets, B, CHUNKS=CHUNKS, BLOCK_V=triton.next_power_of_2(ch),
        BLOCK_E=triton.next_power_of_2(min(E, 2048)), PDL=pdl, HAS_WPE=wpe is not None, num_warps=4, **kw)
    if pdl:
        prefer_max_shared(kernel)
