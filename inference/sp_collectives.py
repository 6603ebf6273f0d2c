"""The sequence-parallel prefill's all-gathers and reduce-scatters, pulled over NVLink by the
copy engines from symmetric memory.

A Llama-3-8B prefill of 4 x 2048 at TP=2 runs 64 all-gathers and 64 reduce-scatters of
[8192, 4096] bf16 (32 MB per rank each way). NCCL's ring kernels move them at about 220 GB/s and
occupy SMs; the copy engines pull them at about 345 GB/s on 2x H200 (93 us per 32 MB in the
prefill's profile): 102.9 vs 112.7 ms per prefill (`benchmarks/results/tp_h200x2.md`).

Here each rank's rows sit in a symmetric buffer (torch.distributed's `_symmetric_memory`:
every rank maps every peer's allocation), and a rank copies what it needs from its peers with
`copy_` on the peer's mapped rows, which the driver runs as a peer-to-peer memcpy on a copy
engine:

- all-gather: the rank's rows go into its slot (the RMSNorm writes them there), one barrier,
  then each peer's rows are copied from the peer's slot into the same rows of this rank's
  slot. The slot, now holding every row, is the result: the column-parallel GEMMs read it
  where it lies.
- reduce-scatter (`gemm_reduce_scatter`): the row-parallel GEMM writes its partial product
  straight into the slot (`matmul.gemm(out=)`), one barrier, then each peer's partial of this rank's rows is copied
  over and the partials are added in rank order, then the local residual (at two ranks one
  launch, `llama_kernels.sum_pair_add`). The sum of a row does not depend on which rank
  computes it. By default (CUTE_KERNELS_TP_SP_OVERLAP) the GEMM first
  computes the rows the peers pull, then the barrier, and the copy engines pull on a side
  stream while the SMs compute this rank's own rows: 102.9 vs 108.5 ms per prefill.

Reuse without a second barrier: each kind has two slots used in turn. A rank writes a slot
again two calls later, behind the barrier of the call in between on its stream; every peer
reached that barrier only after finishing its copies of the call before (work on a stream runs
in order). The returned all-gather slot is read by the GEMMs issued before the next call's
writes on the same stream, for the same reason.

Every rank must make the same sequence of calls (as with NCCL). Buffers are allocated on
first use and grown collectively when a longer prompt comes, up to MAX_SLOT_BYTES a slot;
longer collectives (and rows that do not split evenly) run on NCCL.
"""

from __future__ import annotations

import contextlib

import torch

_KINDS = {"gather": 0, "scatter": 2}  # slot pairs in the buffer
# The buffer holds four slots; past this many bytes a slot (a 64k-token prompt of an 8B model
# would need 512 MB each) the collectives go to NCCL instead of growing it.
MAX_SLOT_BYTES = 256 << 20


class P2PSeqCollectives:
    def __init__(self, group_name: str, rank: int, size: int, device: torch.device):
        self.group_name, self.rank, self.size, self.device = group_name, rank, size, device
        self._buf: torch.Tensor | None = None
        self._handle = None
        self._slot_elems = 0
        self._turn = {k: 0 for k in _KINDS}
        self._side = None  # the stream gemm_reduce_scatter pulls on

    def fits(self, rows: int, hidden: int, dtype: torch.dtype) -> bool:
        """Whether a [rows, hidden] collective runs here (else NCCL): rows split evenly and a
        slot within MAX_SLOT_BYTES."""
        return rows % self.size == 0 and rows * hidden * torch.finfo(dtype).bits // 8 <= MAX_SLOT_BYTES

    def _ensure(self, elems: int, dtype: torch.dtype) -> None:
        if self._buf is not None and elems <= self._slot_elems and dtype == self._buf.dtype:
            return
        import torch.distributed._symmetric_memory as symm_mem

        # Collective: every rank reaches the same call with the same shape.
        if self._handle is not None:
            # Peers may still be copying from the old buffer on their streams: wait for every
            # rank to get here on the device, and for this device, before it is freed.
            self._handle.barrier(channel=0)
            torch.cuda.current_stream(self.device).synchronize()
        self._buf = self._handle = None
        self._buf = symm_mem.empty(4 * elems, dtype=dtype, device=self.device)
        self._handle = symm_mem.rendezvous(self._buf, self.group_name)
        self._slot_elems = elems

    def _slot(self, kind: str, rows: int, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        if rows % self.size:
            raise ValueError(f"{rows} rows do not split over {self.size} ranks")
        self._ensure(rows * hidden, dtype)
        index = _KINDS[kind] + self._turn[kind]
        self._turn[kind] ^= 1
        offset = index * self._slot_elems
        return self._buf[offset:offset + rows * hidden].view(rows, hidden), offset

    def _peer_rows(self, peer: int, offset: int, first_row: int, n: int, hidden: int) -> torch.Tensor:
        return self._handle.get_buffer(peer, (n, hidden), self._buf.dtype, offset + first_row * hidden)

    def gather_slot(self, n: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        """The [size * n, hidden] buffer of the next all-gather: the producer writes this rank's
        n rows (rank * n onwards) into it, then hands it to `all_gather`."""
        slot, offset = self._slot("gather", n * self.size, hidden, dtype)
        self._gather_offset = offset
        return slot

    def all_gather(self, slot: torch.Tensor) -> torch.Tensor:
        """`slot` (from `gather_slot`, this rank's rows written) with every rank's rows, in rank order."""
        rows, hidden = slot.shape
        n = rows // self.size
        offset = self._gather_offset
        self._handle.barrier(channel=0)
        for step in range(1, self.size):
            peer = (self.rank + step) % self.size
            slot[peer * n:(peer + 1) * n].copy_(self._peer_rows(peer, offset, peer * n, n, hidden))
        return slot

    def gemm_reduce_scatter(self, produce, rows: int, hidden: int, dtype: torch.dtype,
                            residual: torch.Tensor, overlap: bool = True) -> torch.Tensor:
        """This rank's rows of the sum over ranks of a [rows, hidden] partial product, plus
        residual. produce(lo, hi, out) writes rows lo..hi-1 of this rank's partial into out
        (the slot of the symmetric buffer). overlap: the rows the peers pull come first; after
        the barrier the copy engines pull the peers' partials of this rank's rows on a side
        stream while the SMs compute those rows here. Otherwise all rows, the barrier, then the
        pulls on this stream."""
        slot, offset = self._slot("scatter", rows, hidden, dtype)
        n = rows // self.size
        own = slot[self.rank * n:(self.rank + 1) * n]
        peers = [(self.rank + step) % self.size for step in range(1, self.size)]
        if overlap:
            for peer in peers:
                produce(peer * n, (peer + 1) * n, slot[peer * n:(peer + 1) * n])
        else:
            produce(0, rows, slot)
        self._handle.barrier(channel=0)
        main = torch.cuda.current_stream(self.device)
        if overlap:
            if self._side is None:
                self._side = torch.cuda.Stream(self.device)
            self._side.wait_stream(main)
        with torch.cuda.stream(self._side) if overlap else contextlib.nullcontext():
            by_rank = {peer: self._peer_rows(peer, offset, self.rank * n, n, hidden).clone() for peer in peers}
        if overlap:
            produce(self.rank * n, (self.rank + 1) * n, own)
            main.wait_stream(self._side)
            for t in by_rank.values():
                t.record_stream(main)  # made on the side stream, read and freed on this one
        by_rank[self.rank] = own
        return self._sum(by_rank, residual)

    def _sum(self, by_rank: dict, residual: torch.Tensor) -> torch.Tensor:
        # Rank order, so that the sum does not depend on which rank computes it.
        if self.size == 2 and residual.is_contiguous() and residual.dtype in (torch.bfloat16, torch.float16):
            from .llama_kernels import sum_pair_add

            return sum_pair_add(by_rank[0], by_rank[1], residual)
        acc = torch.add(by_rank[0], by_rank[1])
        for r in range(2, self.size):
            acc.add_(by_rank[r])
        return acc.add_(residual)
