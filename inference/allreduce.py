"""The "push" all-reduce: one Triton kernel for the small all-reduces of tensor-parallel decode.

A decode step of Llama-3-8B at TP=2 all-reduces 65 rows of 8 KB. NCCL's ring kernel takes 7-10 us
each inside a CUDA graph, PyTorch symmetric memory's one-shot kernel 10 us: both are latency, not
bandwidth (8 KB crosses NVLink in well under a microsecond). This kernel needs one one-way trip:

- Every rank owns a symmetric receive buffer, [2 slots][size sources][n_max elements], and a
  symmetric flag array, [size sources][MAX_CTAS]. Program j of rank r stores its block of r's
  partial sum straight into slot s of every peer's buffer (NVLink stores, fire and forget), then
  sets its flag there to the epoch, with release semantics at system scope.
- It then waits (acquire, system scope) until every peer's flag for program j has reached the
  epoch, reads their blocks from its own buffer and adds the size partials in rank order, so
  every rank gets bit-identical sums.
- Epochs live in a per-program counter in device memory, advanced by the kernel itself: a CUDA
  graph replays the same launch and still sees a new epoch each time. The slot is the epoch's
  parity. A rank writes slot s again two epochs later, and only after its peers' flags for the
  epoch in between, which they set after they finished reading slot s (kernels on a stream run
  in order), so no second barrier is needed.
- A wait gives up after tens of seconds of polling rather than hang, and records it
  (`PushAllReduce.failed()`, which `bench --tp` reports): a peer that left the group must not
  freeze the process. The bound is far above a peer's longest legitimate delay (a kernel
  compiling on its first call) so that it never cuts a live all-reduce short.

Program j of every rank handles the same elements, and every rank issues the same sequence of
all-reduces (as with NCCL), so the per-program epochs agree across ranks.
"""

from __future__ import annotations

import torch

from cute_kernels.runtime.triton_launch import TritonLaunch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton: PushAllReduce reports it, nothing else needs it
    triton = None

BLOCK = 1024  # elements per program: 2 KB of bf16, 16-byte stores over 128 threads
# Polls of a flag before a wait gives up (each an uncached system-scope load, 0.5-1 us): 30-60 s.
MAX_POLLS = 1 << 26

if triton is not None:

    @triton.jit
    def _push_all_reduce_kernel(x_ptr, out_ptr, n, data_ptrs, flag_ptrs, counter_ptr, error_ptr, rank,
                                N_MAX: tl.constexpr, MAX_CTAS: tl.constexpr, SIZE: tl.constexpr,
                                BLOCK: tl.constexpr, MAX_POLLS: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            # In the decode chain: launched while the GEMV before it still runs (everything below
            # reads what earlier kernels wrote), and letting the GEMV after it launch at once, so
            # that one's weight loads are in flight while this waits for the peers.
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        j = tl.program_id(0)
        offs = j * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        dt = x_ptr.dtype.element_ty
        epoch = tl.load(counter_ptr + j) + 1
        slot = epoch % 2
        x = tl.load(x_ptr + offs, mask=m)
        for p in tl.static_range(SIZE):
            if p != rank:
                # The buffers are page-aligned: say so, or the stores go out one element at a time.
                peer = tl.multiple_of(tl.load(data_ptrs + p).to(tl.pointer_type(dt)), 16)
                tl.store(peer + (slot * SIZE + rank) * N_MAX + offs, x, mask=m)
        # Every thread's stores are issued before one release makes them visible to the peer.
        tl.debug_barrier()
        for p in tl.static_range(SIZE):
            if p != rank:
                peer_flags = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(peer_flags + rank * MAX_CTAS + j, epoch, sem="release", scope="sys")
        own_flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))
        own = tl.multiple_of(tl.load(data_ptrs + rank).to(tl.pointer_type(dt)), 16)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(SIZE):
            if p == rank:
                acc += x.to(tl.float32)
            else:
                flag = own_flags + p * MAX_CTAS + j
                seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
                polls = 0
                while (seen < epoch) & (polls < MAX_POLLS):
                    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
                    polls += 1
                if seen < epoch:
                    tl.atomic_xchg(error_ptr, 1)
                tl.debug_barrier()
                # volatile: the block arrived over NVLink; a line of this slot from two epochs ago
                # may still sit in this SM's L1.
                acc += tl.load(own + (slot * SIZE + p) * N_MAX + offs, mask=m, volatile=True).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(dt), mask=m)
        tl.store(counter_ptr + j, epoch)


    # Launched without the JIT's per-call dispatch once compiled (runtime/triton_launch.py).
    _LAUNCH = TritonLaunch(_push_all_reduce_kernel)


class PushAllReduce:
    """The push all-reduce's buffers for one process group and device. Collective: every rank
    constructs it, in the same order, outside any CUDA-graph capture. Sums tensors of up to
    max_bytes (any 16-bit or fp32 dtype) contiguous on that device."""

    def __init__(self, group_name: str, rank: int, size: int, device: torch.device, max_bytes: int):
        if triton is None:
            raise ValueError("the push all-reduce needs Triton")
        if size < 2 or size > 8:
            raise ValueError(f"the push all-reduce takes 2 to 8 ranks, got {size}")
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.rank, self.size, self.device, self.max_bytes = rank, size, device, max_bytes
        self.max_ctas = triton.cdiv(max_bytes // 2, BLOCK)  # 16-bit elements: the most programs
        data = symm_mem.empty(2 * size * max_bytes, dtype=torch.uint8, device=device)
        flags = symm_mem.empty(size * self.max_ctas, dtype=torch.int32, device=device)
        flags.zero_()
        hd, hf = symm_mem.rendezvous(data, group_name), symm_mem.rendezvous(flags, group_name)
        self._keep = (data, flags, hd, hf)
        self.data_ptrs = torch.tensor(list(hd.buffer_ptrs), dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor(list(hf.buffer_ptrs), dtype=torch.int64, device=device)
        self.counters = torch.zeros(self.max_ctas, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)
        from cute_kernels.matmul.gemv import pdl_enabled, prefer_max_shared

        self._pdl_enabled, self._prefer_max_shared = pdl_enabled, prefer_max_shared
        torch.cuda.synchronize(device)
        dist.barrier()  # every rank's flags are zero before any rank signals

    def fits(self, x: torch.Tensor) -> bool:
        return (x.is_cuda and x.device == self.device and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
                and x.numel() * x.element_size() <= self.max_bytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fits(x):
            raise ValueError(f"push all-reduce: a CUDA tensor on {self.device} of bf16 / fp16 / fp32 and at most "
                             f"{self.max_bytes} bytes, got {x.dtype} {tuple(x.shape)} on {x.device}")
        return self.launch(x)

    def launch(self, x: torch.Tensor) -> torch.Tensor:
        """__call__ for a tensor that `fits` (the caller checked)."""
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        if n == 0:
            return out
        pdl = self._pdl_enabled()
        kernel = _LAUNCH.all_args(
            (triton.cdiv(n, BLOCK), 1, 1),
            (x, out, n, self.data_ptrs, self.flag_ptrs, self.counters, self.error, self.rank,
             self.max_bytes // x.element_size(), self.max_ctas, self.size, BLOCK, MAX_POLLS, pdl),
            num_warps=4, **({"launch_pdl": True} if pdl else {}))
        if pdl and kernel is not None:  # a launch through the JIT: the kernel may be new
            self._prefer_max_shared(kernel)
        return out

    def failed(self) -> bool:
        """Whether a wait ever gave up (a peer that never signalled): the sums since are wrong.
        Synchronizes the device."""
        return bool(self.error.item())
