"""Tensor parallelism (Megatron-style) across the GPUs of one host, for the patched models.

Each rank holds a slice of every large weight and runs the same forward on its slice:

- Column-parallel (the output features split by rank, no communication): q/k/v (GPT-2's fused
  c_attn: each rank takes its heads' slice of q, of k and of v, so its local output is still
  [q | k | v] with contiguous heads), gate/up, GPT-2's c_fc. Attention heads and the KV cache
  follow: a rank attends over its own query heads and KV heads (GQA needs the KV heads to
  split evenly, and the query heads with them).
- Row-parallel (the input features split by rank): o_proj / down_proj (GPT-2: both c_proj).
  Each rank's GEMM gives a partial product; bias and residual are added in the epilogue on
  rank 0 only, and one all-reduce sums the partials, so the sum is the unsharded output and
  the fused epilogue stays (`_CuteLinearMixin._run` reads the module's `tp`).
- Vocabulary-parallel: the token embedding keeps a vocabulary slice per rank (a masked
  lookup, then an all-reduce: the one rank that owns a token contributes its row); the
  lm_head computes its slice of the logits, which are all-gathered for a full forward, or
  reduced to the greedy token by a distributed argmax (value and index per rank, one small
  all-gather) in the decode loops. A vocabulary that does not split evenly (GPT-2's 50257)
  pads the last shard with zero rows, which the gather and the argmax leave out.

Sequence parallelism (the Llama family's prefill, CUTE_KERNELS_TP_SEQ_PARALLEL): over long
inputs the residual stream between decoder layers is split by rows, 1/size per rank; each
half-layer all-gathers its normalized rows for the column-parallel projections and ends its
row-parallel projection in a reduce-scatter instead of an all-reduce (SeqParallelDecoderLayer).

The all-reduce is one function (`TPGroup.all_reduce`) with three families of backends: NCCL
(`dist.all_reduce`; gloo on the CPU), PyTorch symmetric memory's one-shot / two-shot kernels,
and our push kernel (inference/allreduce.py: each rank stores its partial straight into every
peer's buffer and raises one flag per block, a single one-way NVLink trip). The last two need
buffers allocated and exchanged by every rank up front (`TPGroup.setup`); messages larger than
them go to NCCL, whose ring reaches the link bandwidth on prefill's tens of MB.

Random-weight models are built sharded (`build_random`): the model is made on the meta
device, sharded there, then each rank materializes only its slices; every full tensor is
generated from a generator seeded with the parameter's name and sliced, one tensor at a
time, so a TP=1 and a TP=N model are the same model and a 70B shape never exists whole on
one GPU.

TP-invariant arithmetic (inference/invariant.py, `patch_model(..., tp_invariant=P)`) makes a
sharded model compute the unsharded one's bits, at a cost in speed; by default a TP=N forward
sums bf16 partials and agrees with TP=1 to within rounding only.

A sharded model runs only through `patch_model(..., tp=...)`: the stock modules would
compute partial products silently, so a forward of a sharded, unpatched model raises.
"""

from __future__ import annotations

import os
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .modules import CuteLMHead

if TYPE_CHECKING:
    from .sp_collectives import P2PSeqCollectives

ALLREDUCE_ENV = "CUTE_KERNELS_TP_ALLREDUCE"
SP_NORM_ENV = "CUTE_KERNELS_TP_SP_NORM"
SEQ_PARALLEL_ENV = "CUTE_KERNELS_TP_SEQ_PARALLEL"
SP_P2P_ENV = "CUTE_KERNELS_TP_SP_P2P"
SP_OVERLAP_ENV = "CUTE_KERNELS_TP_SP_OVERLAP"
# Sequence-parallel norms from this many rows on: below it (decode, short prompts) the
# all-gather's latency costs more than the rows it saves.
SP_MIN_ROWS = 1024
# nccl: dist.all_reduce always. one-shot / two-shot: symmetric memory up to SYMM_MAX_BYTES,
# NCCL above. push: our kernel (inference/allreduce.py) up to SYMM_MAX_BYTES, NCCL above.
# auto: push where symmetric memory and Triton are available on CUDA, NCCL otherwise.
ALLREDUCES = ("auto", "nccl", "one-shot", "two-shot", "push")
# Decode all-reduces are [B, hidden] rows (8 KB for Llama-3-8B at batch 1); prefill's are
# tens of MB, where NCCL's ring reaches the link bandwidth and the one-shot read of every
# peer's buffer does not.
SYMM_MAX_BYTES = 1 << 20
# The distributed argmax carries indices as float32: exact below 2**24.
MAX_VOCAB = 1 << 24
INIT_TIMEOUT = timedelta(minutes=5)


class TPGroup:
    """A tensor-parallel group: its ranks, and the all-reduce / all-gather the parallel
    modules use. `allreduce` is one of ALLREDUCES (None: the CUTE_KERNELS_TP_ALLREDUCE
    switch)."""

    def __init__(self, group=None, allreduce: str | None = None):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("tensor parallelism needs torch.distributed initialized (init_tp(), or launch with "
                             "torchrun and call torch.distributed.init_process_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.comm_backend = str(dist.get_backend(group)).lower()  # "nccl" or "gloo"
        from cute_kernels.runtime import env

        if allreduce is None:
            allreduce = env.get(ALLREDUCE_ENV)
        if allreduce not in ALLREDUCES:
            raise ValueError(f"all-reduce backend must be one of {ALLREDUCES}, got {allreduce!r}")
        self.requested = allreduce
        self.allreduce = "nccl"  # until setup() has a symmetric buffer
        # The Llama family's RMSNorms over >= sp_min_rows rows: each rank normalizes its share
        # of the rows, an all-gather assembles them (SeqParallelNorm).
        self.sp_norms = env.enabled(SP_NORM_ENV)
        self.sp_min_rows = SP_MIN_ROWS
        # The Llama family's residual stream split by rows between decoder layers over
        # >= sp_min_rows rows (SeqParallelDecoderLayer); sp_shape is the full [B, S, hidden]
        # of the forward in flight, which the layers and the final norm gather back to.
        self.seq_parallel = env.enabled(SEQ_PARALLEL_ENV)
        self.sp_shape: torch.Size | None = None
        # The sequence-parallel layers' all-gathers and reduce-scatters as copy-engine pulls
        # from symmetric memory (sp_collectives.py) where setup() could build them; NCCL otherwise.
        self.sp_p2p = env.enabled(SP_P2P_ENV)
        # ... and each reduce-scatter's pulls overlapped with the row-parallel GEMM's own rows.
        self.sp_overlap = env.enabled(SP_OVERLAP_ENV)
        self._p2p = None
        # True while the Llama family's model body runs its forward (its embedding output then
        # goes to the first decoder layer, which may keep only local rows); false for the decode
        # loops, which call the embedding themselves.
        self.sp_body = False
        self._symm: dict[torch.dtype, torch.Tensor] = {}
        self._push = None  # allreduce.PushAllReduce, built by setup()
        self._group_name = None

    def __repr__(self):
        return f"TPGroup(rank={self.rank}, size={self.size}, comm={self.comm_backend}, allreduce={self.allreduce})"

    # ------------------------------------------------------------------ setup

    def setup(self, device: torch.device, dtype: torch.dtype, max_bytes: int = SYMM_MAX_BYTES) -> None:
        """Collective (every rank calls it): warms the communicator and, for a symmetric-memory
        all-reduce on CUDA, allocates and exchanges the buffer. Must run before any CUDA-graph
        capture that contains an all-reduce."""
        import torch.distributed as dist

        x = torch.ones(8, device=device, dtype=dtype)
        dist.all_reduce(x, group=self.group)  # creates the communicator outside any capture
        if self._p2p is None and device.type == "cuda" and self.size > 1 and symm_mem_problem("push") is None:
            from .sp_collectives import P2PSeqCollectives

            self._p2p = P2PSeqCollectives((self.group or dist.group.WORLD).group_name, self.rank, self.size, device)
        want = self.requested
        if want == "nccl" or device.type != "cuda" or self.size == 1:
            self.allreduce = "nccl"
            return
        why = symm_mem_problem("push" if want == "auto" else want)
        if why is not None:
            if want != "auto":
                raise ValueError(f"all-reduce backend {want!r} needs PyTorch symmetric memory: {why}")
            self.allreduce = "nccl"
            return
        import torch.distributed._symmetric_memory as symm_mem

        group = self.group or dist.group.WORLD
        self._group_name = group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required by older releases, a no-op later
            import warnings

            with warnings.catch_warnings():  # later releases deprecate it with a FutureWarning per rank
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(self._group_name)
        # auto builds every backend's buffers, so bench --allreduce can compare them in one process.
        if self._push is None and want in ("auto", "push"):
            from .allreduce import PushAllReduce

            try:
                self._push = PushAllReduce(self._group_name, self.rank, self.size, device, max_bytes)
            except (RuntimeError, ValueError) as e:  # e.g. no peer access between these GPUs
                if want == "push":
                    raise ValueError(f"the push all-reduce could not set up its buffers: {e}") from e
                if self.rank == 0:
                    print(f"note: the push all-reduce is unavailable ({str(e).splitlines()[0][:120]}); using NCCL")
                self.allreduce = "nccl"
                return
        if dtype not in self._symm and (want != "push" and symm_mem_problem("one-shot") is None):
            buf = symm_mem.empty(max_bytes // torch.finfo(dtype).bits * 8, dtype=dtype, device=device)
            symm_mem.rendezvous(buf, self._group_name)
            self._symm[dtype] = buf
        self.allreduce = "push" if want == "auto" else want
        torch.cuda.synchronize(device)
        dist.barrier(group=self.group)

    def use(self, allreduce: str) -> None:
        """Switch the all-reduce backend (A/B runs); symmetric memory needs setup() first."""
        if allreduce not in ALLREDUCES or allreduce == "auto":
            raise ValueError(f"all-reduce backend must be one of {ALLREDUCES[1:]}, got {allreduce!r}")
        if allreduce != "nccl":
            why = symm_mem_problem(allreduce)
            if why is None and not (self._push if allreduce == "push" else self._symm):
                why = f"setup() built no buffer for it (CPU, or another backend requested: {self.requested})"
            if why is not None:
                raise ValueError(f"all-reduce backend {allreduce!r} is not available: {why}")
        self.allreduce = allreduce

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the group (use the returned tensor: it may be a new one)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        if self.allreduce == "push" and self._push.fits(x):
            return self._push.launch(x)
        buf = self._symm.get(x.dtype) if self.allreduce in ("one-shot", "two-shot") else None
        n = x.numel()
        if buf is not None and x.is_cuda and n <= buf.numel() and (self.allreduce == "one-shot" or n % self.size == 0):
            x = x.contiguous()
            out = torch.empty_like(x)
            ops = torch.ops.symm_mem
            if self.allreduce == "one-shot" and hasattr(ops, "one_shot_all_reduce_copy_out"):
                ops.one_shot_all_reduce_copy_out(buf[:n], x.view(-1), "sum", self._group_name, out.view(-1))
                return out
            buf[:n].copy_(x.view(-1))
            if self.allreduce == "one-shot":
                ops.one_shot_all_reduce_out(buf[:n], "sum", self._group_name, out.view(-1))
            else:
                ops.two_shot_all_reduce_out(buf[:n], "sum", self._group_name, out.view(-1))
            return out
        if not x.is_contiguous():
            x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def ordered_sum(self, x: torch.Tensor) -> torch.Tensor | None:
        """The sum of x over the group as ((0 + x_0) + x_1) + ... in x's dtype, rank order (our push
        kernel: fp32 accumulation, one rounding), where the push all-reduce is in use and takes
        x; None otherwise (the caller gathers and adds itself). inference/invariant.py relies on
        the order."""
        if self.size > 1 and self.allreduce == "push" and self._push.fits(x):
            return self._push.launch(x.contiguous())
        return None

    def push_gave_up(self) -> bool:
        """Whether a wait of the push all-reduce ever gave up (its sums since are wrong);
        synchronizes the device. False where the push kernel was never set up."""
        return self._push is not None and self._push.failed()

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's x, in rank order."""
        import torch.distributed as dist

        x = x.contiguous()
        if self.size == 1:
            return x.unsqueeze(0)
        out = x.new_empty((self.size, *x.shape))
        if self.comm_backend == "nccl":
            dist.all_gather_into_tensor(out, x, group=self.group)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(out.unbind(0)), x, group=self.group)
        return out

    def sp_all_gather(self, norm, x: torch.Tensor, shape) -> torch.Tensor:
        """The sequence-parallel layers' normalized all-gather: norm (a SeqParallelNorm) of this
        rank's rows x [n, hidden], every rank's in rank order, viewed as `shape`. With the
        copy-engine collectives our RMSNorm writes straight into the gather buffer, and the result
        lives in that buffer until the second-next sp_all_gather: consume it before then."""
        n, hidden = x.shape
        if not (self.sp_p2p and self._p2p is not None and x.is_cuda and self._p2p.fits(n * self.size, hidden, x.dtype)):
            return self.all_gather(norm.local(x)).view(shape)
        from .patch_llama import _CuteRMSNorm

        slot = self._p2p.gather_slot(n, hidden, x.dtype)
        mine = slot[self.rank * n:(self.rank + 1) * n]
        if not (isinstance(norm, _CuteRMSNorm) and norm.forward_into(x, mine)):
            mine.copy_(norm.local(x))
        return self._p2p.all_gather(slot).view(shape)

    def p2p_reduce_scatter(self, rows: int, hidden: int, dtype: torch.dtype) -> P2PSeqCollectives | None:
        """The copy-engine collectives for a sequence-parallel reduce-scatter of [rows, hidden],
        or None (NCCL)."""
        return self._p2p if self.sp_p2p and self._p2p is not None and self._p2p.fits(rows, hidden, dtype) else None

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's 1/size of the rows (dim 0, in rank order) of the sum of x over the group.
        x may be overwritten."""
        if self.size == 1:
            return x
        if x.dim() == 0 or x.shape[0] % self.size:
            raise ValueError(f"reduce_scatter splits dim 0 evenly over {self.size} ranks, got shape {tuple(x.shape)}")
        import torch.distributed as dist

        x = x.contiguous()
        n = x.shape[0] // self.size
        if self.comm_backend == "nccl":
            out = x.new_empty((n, *x.shape[1:]))
            dist.reduce_scatter_tensor(out, x, group=self.group)
            return out
        # gloo (the CPU tests) has no reduce-scatter: the whole sum, then this rank's rows.
        dist.all_reduce(x, group=self.group)
        return x[self.rank * n:(self.rank + 1) * n]

    def argmax(self, logits: torch.Tensor, start: int, n_valid: int) -> torch.Tensor:
        """Greedy token ids [...] from this rank's vocabulary slice of the logits [..., >= n_valid]
        (columns start .. start + n_valid of the full vocabulary): each rank's maximum and its
        index, one all-gather, the first rank holding the overall maximum. Equal maxima resolve
        to the lowest index, as torch.argmax does."""
        v, i = logits[..., :n_valid].float().max(-1)
        pair = torch.stack([v, (i + start).float()], -1)
        both = self.all_gather(pair)  # [size, ..., 2]
        best = both[..., 0].argmax(0, keepdim=True)  # the first rank on ties: its indices are lower
        return both[..., 1].gather(0, best).squeeze(0).long()

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)


_SYMM_OPS = {"one-shot": "one_shot_all_reduce_out", "two-shot": "two_shot_all_reduce_out"}


def symm_mem_problem(allreduce: str = "one-shot") -> str | None:
    """Why the symmetric-memory all-reduce `allreduce` (one-shot, two-shot: PyTorch's kernels;
    push: ours over PyTorch's buffers) is not usable here, or None."""
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch.distributed._symmetric_memory does not import ({e})"
    if allreduce == "push":
        from .allreduce import triton

        if triton is None:
            return "Triton does not import"
        missing = [n for n in ("empty", "rendezvous") if not hasattr(symm_mem, n)]
        return f"torch.distributed._symmetric_memory has no {', '.join(missing)}" if missing else None
    if not hasattr(getattr(torch.ops, "symm_mem", None), _SYMM_OPS[allreduce]):
        return f"torch.ops.symm_mem has no {_SYMM_OPS[allreduce]} in torch {torch.__version__}"
    return None


def init_tp(size: int, allreduce: str | None = None) -> TPGroup:
    """The default process group of a torchrun launch (NCCL on CUDA, gloo otherwise) as a
    TPGroup of `size` ranks; ValueError when the launch has another world size. Each rank
    takes the GPU of its LOCAL_RANK."""
    import torch.distributed as dist

    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tp must be a positive int, got {size!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != size:
        raise ValueError(f"--tp {size} needs {size} processes (torchrun --nproc-per-node {size}); "
                         f"this launch has WORLD_SIZE={world}")
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a plain single process (tp=1): a group of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            os.environ.setdefault("RANK", "0")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        kw = {"device_id": torch.device("cuda", torch.cuda.current_device())} if cuda else {}
        dist.init_process_group("nccl" if cuda else "gloo", timeout=INIT_TIMEOUT, world_size=world,
                                rank=int(os.environ.get("RANK", "0")), **kw)
    return TPGroup(None, allreduce)


def shutdown() -> None:
    """Leave the process group without hanging: a barrier so no rank tears down while another
    still communicates, then destroy only where it is known to return (gloo); NCCL's
    destroy was seen to hang at exit, and the process ends right after anyway."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dist.barrier()
    finally:
        if str(dist.get_backend()).lower() == "gloo":
            dist.destroy_process_group()


def as_group(tp) -> TPGroup | None:
    """patch_model's `tp`: None or 1 (no parallelism), a world size (the default group), a
    TPGroup, or a torch.distributed ProcessGroup."""
    if tp is None or isinstance(tp, TPGroup):
        return tp
    if isinstance(tp, bool) or not isinstance(tp, int):
        import torch.distributed as dist

        if isinstance(tp, dist.ProcessGroup):
            return TPGroup(tp)
        raise TypeError(f"tp must be None, an int world size, a TPGroup or a ProcessGroup, got {type(tp).__name__}")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if tp == 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError(f"tp={tp} needs torch.distributed initialized (init_tp({tp}) under torchrun)")
    if dist.get_world_size() != tp:
        raise ValueError(f"tp={tp} but the default process group has {dist.get_world_size()} ranks")
    return TPGroup(None)


def tp_of(model) -> TPGroup | None:
    """The model's TPGroup when it is sharded, else None."""
    return getattr(model, "cute_tp", None)


def tp_size(model) -> int:
    g = tp_of(model)
    return 1 if g is None else g.size


# --------------------------------------------------------------------------- parallel modules


class VocabParallelEmbedding(nn.Embedding):
    """An embedding holding rows vocab_start .. vocab_start + n_valid of the vocabulary (the
    last shard padded with zero rows): tokens of other ranks look up zeros, and the
    all-reduce adds the one owner's row."""

    tp: TPGroup
    vocab_start: int
    n_valid: int

    sp_first = None  # the Llama family's first SeqParallelDecoderLayer (finish_patch)

    def forward(self, ids):
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.n_valid)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        part = out * mine.unsqueeze(-1).to(out.dtype)
        if self.sp_first is not None and self.tp.sp_body and self.sp_first.splits(part):
            # The first decoder layer keeps only this rank's rows of the sum: reduce-scatter them
            # (half an all-reduce's traffic) into a zero tensor of the full shape, which is all
            # the model's body reads of the embedding (shape, dtype, device) before that layer.
            rows, tp = part.numel() // part.shape[-1], self.tp
            n = rows // tp.size
            full = torch.zeros_like(part)
            full.view(rows, -1)[tp.rank * n:(tp.rank + 1) * n] = tp.reduce_scatter(part.view(rows, -1))
            return full
        return self.tp.all_reduce(part)

    def extra_repr(self):
        return f"{super().extra_repr()}, vocab [{self.vocab_start}, {self.vocab_start + self.n_valid}), tp={self.tp.size}"


class VocabParallelLMHead(CuteLMHead):
    """lm_head over this rank's vocabulary slice: forward all-gathers the full logits;
    the decode loops take the local slice and `greedy_tokens` instead."""

    vocab_tp: TPGroup  # not `tp`: that marks a row-parallel linear, whose outputs are summed
    vocab: int
    vocab_start: int
    n_valid: int

    def forward(self, x, residual=None):
        if residual is not None:
            raise ValueError("a vocabulary-parallel lm_head adds no residual")
        local = super().forward(x)  # [..., shard]
        parts = self.vocab_tp.all_gather(local)  # [size, ..., shard]
        return parts.movedim(0, -2).reshape(*local.shape[:-1], -1)[..., :self.vocab]


class SeqParallelNorm:
    """Mixed in before a family's RMSNorm: over many rows, each rank normalizes its 1/size of
    the rows and one all-gather assembles the whole. Without it every rank normalizes every
    row of the replicated hidden state (the norm's fp32 passes are a large share of a TP
    prefill's non-GEMM time); RMSNorm is row-wise, so the result is the replicated one, bit
    for bit. A 2-D input is a sequence-parallel residual stream's local rows (the model's
    final norm after SeqParallelDecoderLayers): normalized here, gathered to tp.sp_shape,
    which ends the sequence-parallel forward."""

    norm_tp: TPGroup

    def local(self, x):
        """The stock norm of these rows only, no communication."""
        return super().forward(x)

    def forward(self, x):
        tp = self.norm_tp
        shape = tp.sp_shape
        if x.dim() == 2 and shape is not None and x.shape[0] * tp.size == shape[:-1].numel():
            tp.sp_shape = None  # the forward's last gather: a later 2-D call (a decode step's norm) is plain
            return tp.all_gather(super().forward(x)).view(*shape[:-1], x.shape[-1])
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        if not tp.sp_norms or rows < tp.sp_min_rows or rows % tp.size:
            return super().forward(x)
        n = rows // tp.size
        y = super().forward(x.reshape(rows, x.shape[-1])[tp.rank * n:(tp.rank + 1) * n])
        return tp.all_gather(y).view(*x.shape[:-1], y.shape[-1])


class SeqParallelDecoderLayer:
    """Mixed in before our Llama-family decoder layer (patch_llama._CuteDecoderLayer): Megatron
    sequence parallelism. Between layers each rank holds 1/size of the residual stream's
    B*S rows (a 2-D [rows / size, hidden] tensor; the first layer takes its share of the
    replicated embedding output). Per half-layer: the norm on the local rows, an all-gather
    to full rows for the column-parallel projections, the row-parallel projection's partial
    product reduce-scattered back to local rows, plus the local residual. That is one
    reduce-scatter and one all-gather where the replicated stream needs an all-reduce (twice
    the traffic of either) and, with SP norms, an all-gather too. Under tp.sp_min_rows rows,
    or rows that do not split evenly, the layer runs as it does without it (decode, short
    prompts). Hidden states recorded between layers (output_hidden_states) are local rows."""

    sp_tp: TPGroup

    def splits(self, x: torch.Tensor) -> bool:
        """Whether this layer, the first, splits the replicated stream x [..., hidden] by rows."""
        from .patch_llama import _CuteAttention

        tp, rows = self.sp_tp, x.numel() // x.shape[-1]
        return (tp.seq_parallel and not self.training and rows >= tp.sp_min_rows and rows % tp.size == 0
                and isinstance(self.self_attn, _CuteAttention))

    def forward(self, hidden_states, *args, **kwargs):
        from .modules import _stock_arguments

        tp = self.sp_tp
        x = hidden_states
        if x.dim() != 2:  # the first layer: the replicated stream, split here when it is long enough
            rows = x.numel() // x.shape[-1]
            if not self.splits(x):
                tp.sp_shape = None
                return super().forward(hidden_states, *args, **kwargs)
            tp.sp_shape = x.shape
            n = rows // tp.size
            x = x.reshape(rows, x.shape[-1])[tp.rank * n:(tp.rank + 1) * n]
        elif tp.sp_shape is None:
            raise ValueError("a 2-D hidden state reached a sequence-parallel decoder layer outside a "
                             "sequence-parallel forward")
        shape = tp.sp_shape
        a = _stock_arguments(self._stock.forward, args, kwargs)
        full = tp.sp_all_gather(self.input_layernorm, x, shape)
        h, _ = self.self_attn(full, residual=x, **a)  # o_proj: SeqParallelRowLinear, local rows out
        full = tp.sp_all_gather(self.post_attention_layernorm, h, (*shape[:-1], h.shape[-1]))
        return self.mlp_residual(full, h)  # the prefill's SwiGLU fusion as without SP; down_proj: local rows


class SeqParallelRowLinear:
    """Mixed in before our row-parallel linear (o_proj, down_proj of the Llama family): given
    full rows x and a 2-D residual of this rank's local rows (SeqParallelDecoderLayer), the
    partial product (bias on rank 0) is reduce-scattered and the local residual added after;
    otherwise the fused epilogue and all-reduce as before."""

    def forward(self, x, residual=None):
        if residual is None or residual.dim() != 2 or x.dim() == 2:
            return super().forward(x, residual)
        from . import ops

        tp = self.tp
        w = self.weight if self.weight.is_contiguous() else self.weight.contiguous()
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        if x2.shape[0] != residual.shape[0] * tp.size:
            raise ValueError(f"sequence-parallel {type(self).__name__}: {x2.shape[0]} input rows over {tp.size} "
                             f"ranks, but {residual.shape[0]} local residual rows")
        bias = self.bias if tp.rank == 0 else None
        N = w.shape[0]
        p2p = tp.p2p_reduce_scatter(x2.shape[0], N, x2.dtype)
        if p2p is not None and self.bias is None and not self.activation and self.backend == "cute" and x2.is_cuda:
            from cute_kernels.matmul.api import gemm

            wt = w.t()
            # The partial product straight into the symmetric buffer, rows lo..hi-1 at a time.
            return p2p.gemm_reduce_scatter(lambda lo, hi, out: gemm(x2[lo:hi], wt, out=out), x2.shape[0], N,
                                           x2.dtype, residual, overlap=tp.sp_overlap)
        y = ops.linear(x2, w, bias, None, self.activation or "", 1.0, 1.0, self.backend)
        if y.shape[1] != N:  # the op pads rows to 16 bytes
            y = y[:, :N]
        return tp.reduce_scatter(y) + residual


_SP_CLASSES: dict[tuple[type, type], type] = {}


def _seq_parallel_class(cls: type, mixin: type = SeqParallelNorm) -> type:
    key = (cls, mixin)
    if key not in _SP_CLASSES:
        _SP_CLASSES[key] = type(f"SeqParallel{cls.__name__}", (mixin, cls), {})
    return _SP_CLASSES[key]


def greedy_tokens(head, logits: torch.Tensor) -> torch.Tensor:
    """argmax(-1) of the logits that `head` computed: its local vocabulary slice when it is
    vocabulary-parallel (a distributed argmax), the full row otherwise."""
    if isinstance(head, VocabParallelLMHead):
        return head.vocab_tp.argmax(logits, head.vocab_start, head.n_valid)
    return logits.argmax(-1)


# --------------------------------------------------------------------------- sharding


def _chunk(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    n = t.shape[dim] // size
    return t.narrow(dim, rank * n, n)


def _fused_chunk(t: torch.Tensor, dim: int, rank: int, size: int, parts: int = 3) -> torch.Tensor:
    """This rank's slice of each of `parts` equal blocks along dim (GPT-2's [q | k | v])."""
    return torch.cat([_chunk(b, dim, rank, size) for b in t.chunk(parts, dim)], dim)


def vocab_shard(vocab: int, rank: int, size: int) -> tuple[int, int, int]:
    """(rows per shard, this shard's first row, its real rows): shards of ceil(V / size) rows."""
    per = -(-vocab // size)
    start = rank * per
    return per, start, max(0, min(per, vocab - start))


def _vocab_chunk(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    per, start, n = vocab_shard(t.shape[0], rank, size)
    if n == per:
        return t.narrow(0, start, per)
    out = t.new_zeros((per, *t.shape[1:]))
    out[:n] = t[start:start + n]
    return out


def _plan(model, rank: int, size: int) -> list[tuple[str, nn.Parameter, object]]:
    """(name, parameter, slicer) for every parameter that shards: slicer(full) -> this rank's
    slice. Validates the shapes first (ValueError naming what does not split)."""
    cfg = model.config
    plan, seen = [], set()

    def add(module, attr, slicer):
        p = getattr(module, attr, None)
        if p is None or id(p) in seen:
            return
        seen.add(id(p))
        name = next(n for n, q in model.named_parameters(remove_duplicate=False) if q is p)
        plan.append((name, p, slicer))

    def col(dim):
        return lambda t: _chunk(t, dim, rank, size)

    vocab = lambda t: _vocab_chunk(t, rank, size)  # noqa: E731
    if cfg.vocab_size >= MAX_VOCAB:
        raise ValueError(f"vocab_size {cfg.vocab_size} >= {MAX_VOCAB}: the distributed argmax carries indices as float32")
    if -(-cfg.vocab_size // size) * (size - 1) >= cfg.vocab_size:
        raise ValueError(f"vocab_size {cfg.vocab_size} leaves a rank of tp={size} without vocabulary")
    if cfg.model_type == "gpt2":
        heads, inner = cfg.n_head, cfg.n_inner or 4 * cfg.n_embd
        if heads % size or inner % size:
            raise ValueError(f"tp={size} must divide GPT-2's {heads} heads and MLP width {inner}")
        for blk in model.transformer.h:
            add(blk.attn.c_attn, "weight", lambda t: _fused_chunk(t, 1, rank, size))
            add(blk.attn.c_attn, "bias", lambda t: _fused_chunk(t, 0, rank, size))
            add(blk.attn.c_proj, "weight", col(0))  # Conv1D weight is [in, out]
            add(blk.mlp.c_fc, "weight", col(1))
            add(blk.mlp.c_fc, "bias", col(0))
            add(blk.mlp.c_proj, "weight", col(0))
        add(model.transformer.wte, "weight", vocab)
        add(model.lm_head, "weight", vocab)
        return plan
    hq = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or hq
    if hkv % size:
        raise ValueError(f"tp={size} must divide the {hkv} KV heads (num_key_value_heads % tp == 0); "
                         f"a {cfg.model_type} model of {hq} query / {hkv} KV heads runs at tp in "
                         f"{[d for d in range(1, hkv + 1) if hkv % d == 0 and hq % d == 0]}")
    if hq % size or cfg.intermediate_size % size:
        raise ValueError(f"tp={size} must divide the {hq} query heads and the MLP width {cfg.intermediate_size}")
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):  # nn.Linear weight is [out, in]
            add(lin, "weight", col(0))
            add(lin, "bias", col(0))
        add(a.o_proj, "weight", col(1))
        add(m.down_proj, "weight", col(1))
    add(model.model.embed_tokens, "weight", vocab)
    add(model.lm_head, "weight", vocab)
    return plan


def _row_parallel(model) -> list[nn.Module]:
    if model.config.model_type == "gpt2":
        return [m for b in model.transformer.h for m in (b.attn.c_proj, b.mlp.c_proj)]
    return [m for layer in model.model.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


def _embedding(model) -> nn.Embedding:
    return model.transformer.wte if model.config.model_type == "gpt2" else model.model.embed_tokens


def _require_patched(model, args, kwargs):
    if getattr(model, "cute_patch", None) is None:
        raise RuntimeError("this model is sharded for tensor parallelism: run it through "
                           "patch_model(model, ..., tp=...) (its stock modules would sum nothing)")


def shard_model(model, tp) -> TPGroup | None:
    """Slice the model's weights for this rank, in place (meta tensors too); returns its TPGroup.

    GPT2LMHeadModel or a Llama-family *ForCausalLM, unpatched and unsharded. The parameters
    keep their objects (a tied head stays tied) with this rank's data; the row-parallel
    linears and the embedding get the group. patch_model(..., tp=...) calls it, or takes a
    model it already sharded with the same group."""
    group = as_group(tp)
    if group is None:
        return None
    if tp_of(model) is not None:
        raise ValueError("the model is sharded already")
    if getattr(model, "cute_patch", None) is not None:
        raise ValueError("shard the model before patch_model, or pass tp= to patch_model")
    if model.config.model_type != "gpt2" and not hasattr(model, "model"):
        raise ValueError("tensor parallelism needs the causal LM (a *ForCausalLM with lm_head)")
    if getattr(model, "lm_head", None) is None:
        raise ValueError("tensor parallelism needs the causal LM (GPT2LMHeadModel or *ForCausalLM with lm_head)")
    plan = _plan(model, group.rank, group.size)
    with torch.no_grad():
        for _, p, slicer in plan:
            p.data = slicer(p.data).contiguous()
    for m in _row_parallel(model):
        m.tp = group
    for m in model.modules():  # the shapes the modules report (Conv1D's forward reads nf)
        w = getattr(m, "weight", None)
        if isinstance(m, nn.Linear):
            m.out_features, m.in_features = w.shape
        elif hasattr(m, "nf") and w is not None:
            m.nx, m.nf = w.shape
    emb = _embedding(model)
    per, start, n = vocab_shard(model.config.vocab_size, group.rank, group.size)
    emb.__class__ = VocabParallelEmbedding
    emb.tp, emb.vocab_start, emb.n_valid, emb.num_embeddings = group, start, n, per
    if model.config.model_type == "gpt2":
        for blk in model.transformer.h:  # the stock attention splits c_attn's output by these
            blk.attn.split_size //= group.size
            blk.attn.num_heads //= group.size
    model.cute_tp = group
    model.register_forward_pre_hook(_require_patched, with_kwargs=True)
    return group


def finish_patch(model) -> None:
    """After patch_model's module swaps: the lm_head computes its vocabulary slice; the Llama
    family's RMSNorms become sequence-parallel over long inputs (SeqParallelNorm), and its
    decoder layers and row-parallel linears can keep the residual stream split by rows
    (SeqParallelDecoderLayer, SeqParallelRowLinear; CUTE_KERNELS_TP_SEQ_PARALLEL)."""
    group = tp_of(model)
    head = model.lm_head
    if not isinstance(head, CuteLMHead):
        raise ValueError(f"tensor parallelism needs our lm_head (CuteLMHead), got {type(head).__name__}")
    per, start, n = vocab_shard(model.config.vocab_size, group.rank, group.size)
    head.__class__ = VocabParallelLMHead
    head.vocab_tp, head.vocab, head.vocab_start, head.n_valid = group, model.config.vocab_size, start, n
    head.out_features = per
    if model.config.model_type != "gpt2":  # GPT-2's LayerNorms run inside our fused ops, not as modules
        body = model.model
        for norm in [n for layer in body.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)] + \
                [body.norm]:
            norm.__class__ = _seq_parallel_class(type(norm))
            norm.norm_tp = group
        for layer in body.layers:
            layer.__class__ = _seq_parallel_class(type(layer), SeqParallelDecoderLayer)
            layer.sp_tp = group
            for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                lin.__class__ = _seq_parallel_class(type(lin), SeqParallelRowLinear)
        emb = _embedding(model)
        if isinstance(emb, VocabParallelEmbedding) and len(body.layers):
            object.__setattr__(emb, "sp_first", body.layers[0])  # a reference, not a submodule
            body.register_forward_pre_hook(lambda *_: setattr(group, "sp_body", True))
            body.register_forward_hook(lambda *_: setattr(group, "sp_body", False), always_call=True)


# --------------------------------------------------------------------------- random weights


def _init_full(name: str, shape, init_std: float, device, dtype) -> torch.Tensor:
    """The full tensor `name` of a random-weights model, the same for every TP degree: 2-D
    weights normal(0, init_std) from a generator seeded by the name, norm weights ones, biases
    zeros (transformers' init for these models)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape, device=device, dtype=dtype)
    if len(shape) == 1:
        return torch.ones(shape, device=device, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, init_std, generator=gen)


def build_random(config, *, device, dtype, tp=None):
    """A random-weights causal LM of `config`, built sharded for `tp` (None: whole) without
    materializing the full model: meta-device construction, sharding on meta, then each
    parameter filled from its full tensor (`_init_full`), generated one at a time and
    sliced. Returns the model in eval mode (sharded models run after patch_model(tp=...))."""
    import importlib

    from .models import CAUSAL_LM_CLASSES

    group = as_group(tp)
    cls = getattr(importlib.import_module("transformers"), CAUSAL_LM_CLASSES[config.model_type])
    with torch.device("meta"):
        model = cls(config).to(dtype)
    full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    slicers = {}
    if group is not None:
        slicers = {name: s for name, _, s in _plan(model, group.rank, group.size)}
        shard_model(model, group)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives every module a Parameter of its own
    std = getattr(config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = _init_full(name, full_shapes[name], std, device, dtype)
            p.copy_(slicers[name](full) if name in slicers else full)
            del full
        for parent in list(model.modules()):  # buffers computed at construction (RoPE tables)
            for child_name, child in parent.named_children():
                if type(child).__name__.endswith("RotaryEmbedding"):
                    setattr(parent, child_name, type(child)(config=child.config).to(device))
    return model.eval()
