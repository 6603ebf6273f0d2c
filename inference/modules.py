"""What every family's module swaps share: our linear modules and the binding of stock
transformers forward arguments. patch.py (GPT-2, the entry point) and patch_llama.py (the
Llama family) both build on it.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from . import ops


class _CuteLinearMixin:
    """Shared by our linear modules (CuteConv1D, CuteLinear, CuteLMHead): the op call. `weight_nk`
    must be [N, K]."""

    backend: str = "cute"
    activation: str | None = None
    fuses_residual = True  # protocol: forward(x, residual=...) adds it in the epilogue
    tp = None  # a row-parallel linear's TPGroup (inference/tp.py): partial products, summed across ranks
    invariant_pieces = 0  # > 0: TP-invariant arithmetic, K summed in this many pieces (inference/invariant.py)

    def _run(self, x: torch.Tensor, weight_nk: torch.Tensor, bias, residual):
        if not weight_nk.is_contiguous():  # only if someone replaced the storage layout
            weight_nk = weight_nk.contiguous()
        if self.invariant_pieces:
            from .invariant import linear

            return linear(x, weight_nk, bias, residual, pieces=self.invariant_pieces, tp=self.tp, backend=self.backend)
        shape = x.shape[:-1]
        # generate() hands lm_head hidden_states[:, -1:], a strided view: the kernels want dense rows
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        r2 = None if residual is None else residual.reshape(-1, residual.shape[-1]).contiguous()
        N = weight_nk.shape[0]
        bias, r2 = row_parallel_operands(self, bias, r2)
        y = reduce_partial(self, ops.linear(x2, weight_nk, bias, r2, self.activation or "", 1.0, 1.0, self.backend))
        # The op returns rows padded to 16 bytes (lm_head: 50257 -> 50264); drop the padding as a view.
        return (y if y.shape[1] == N else y[:, :N]).view(*shape, N)


def row_parallel_operands(module, bias, residual):
    """(bias, residual) that `module`'s epilogue adds on this rank: for a row-parallel linear
    (module.tp set, inference/tp.py) both on rank 0 and neither elsewhere, so that they enter
    the all-reduced sum once. A decode step that calls the linear op on a module's weights
    directly goes through this and `reduce_partial` too."""
    tp = getattr(module, "tp", None)
    return (None, None) if tp is not None and tp.rank != 0 else (bias, residual)


def reduce_partial(module, y):
    """The row-parallel linear's output summed across its ranks (y itself otherwise)."""
    tp = getattr(module, "tp", None)
    return y if tp is None else tp.all_reduce(y)


class CuteLinear(_CuteLinearMixin, nn.Linear):
    """nn.Linear (weight [out, in] = [N, K] already: no re-layout) on our linear op."""

    @classmethod
    def adopt(cls, module, *, backend: str, activation: str | None = None):
        module.__class__ = cls
        module.backend, module.activation = backend, activation
        return module

    def forward(self, x, residual=None):
        return self._run(x, self.weight, self.bias, residual)

    def extra_repr(self):
        act = f", activation={self.activation}" if self.activation else ""
        return super().extra_repr() + f"{act}, backend={self.backend}"


class CuteLMHead(CuteLinear):
    """lm_head (weight [V, E], possibly tied to the token embedding) on our linear op."""

    @classmethod
    def adopt(cls, module, *, backend: str):
        return super().adopt(module, backend=backend)


def concat_rows(params) -> torch.Tensor:
    """One tensor whose row blocks are the given parameters' data, which are re-pointed at their
    blocks (the weights are not held twice). Parameters that already are consecutive blocks of
    one storage (a decoder built before) are viewed, not copied."""
    ts = [p.data for p in params]
    first = ts[0]
    shape = (sum(t.shape[0] for t in ts), *first.shape[1:])
    same = all(t.is_contiguous() and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
               and t.shape[1:] == first.shape[1:] for t in ts)
    if same and all(b.storage_offset() == a.storage_offset() + a.numel() for a, b in zip(ts, ts[1:])):
        return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), shape,
                                       torch.empty(shape, device="meta").stride())
    cat = torch.cat(ts)
    row = 0
    for p in params:
        p.data = cat[row:row + p.shape[0]]
        row += p.shape[0]
    return cat


class _PositionState:
    """Whether the innermost running patched base model (`OwnPositionsMixin`) makes its own
    position ids and has no cache and no padding mask, so that every row is one plain causal
    sequence.

    Read only by patch.py's mask function. A plain attribute rather than a ContextVar or
    threading.local, so that Dynamo traces it (a compiled patched model keeps one graph)."""

    own = False


POSITIONS = _PositionState()


class OwnPositionsMixin:
    """Mixed in before a stock base model (GPT2Model, LlamaModel, ...; `_stock` is it): marks
    the calls whose position ids the model makes itself, with no cache, padding mask or
    encoder states, in POSITIONS. transformers checks such positions for packed sequences, and
    under CUDA graph capture (where it cannot look at the result) it overlays a packed-sequence
    mask that would send the prefill to SDPA instead of our attention; with the mark, patch.py's
    mask function returns None for these calls."""

    _stock = None

    def forward(self, *args, **kwargs):
        a = _stock_arguments(self._stock.forward, args[1:], kwargs)
        own = (a.get("position_ids") is None and a["cache"] is None and a.get("attention_mask") is None
               and a.get("encoder_hidden_states") is None)
        outer, POSITIONS.own = POSITIONS.own, own
        try:
            return super().forward(*args, **kwargs)
        finally:
            POSITIONS.own = outer


def apply_linear(module, x, residual):
    """module(x) + residual, in the epilogue when the module supports it."""
    if residual is None:
        return module(x)
    if getattr(module, "fuses_residual", False):
        return module(x, residual=residual)
    return module(x) + residual


def _stock_arguments(stock_forward, args: tuple, kwargs: dict) -> dict:
    """The arguments of a call to a stock transformers forward, by name.

    transformers passes some arguments positionally and renames them between releases
    (`past_key_values` became `cache`), so our subclass forwards bind what they receive
    against the installed signature instead of assuming one. The cache is returned under
    the key "cache" whatever its name in this release."""
    names = _positional_names(stock_forward)
    if len(args) > len(names):
        raise TypeError(f"{stock_forward.__qualname__}() takes {len(names)} positional arguments after "
                        f"hidden_states, got {len(args)}")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if "cache" not in bound:
        bound["cache"] = bound.pop("past_key_values", None)
    return bound


_POSITIONAL_NAMES: dict = {}  # a plain dict, not functools.cache: Dynamo traces a lookup in it


def _positional_names(stock_forward) -> tuple[str, ...]:
    """Parameter names after (self, first input) of a stock forward that may come positionally."""
    names = _POSITIONAL_NAMES.get(stock_forward)
    if names is None:
        params = list(inspect.signature(stock_forward).parameters.values())[2:]
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = _POSITIONAL_NAMES[stock_forward] = tuple(p.name for p in params if p.kind in kinds)
    return names


def _stock_kwargs(stock_forward, bound: dict) -> dict:
    """`bound` (from _stock_arguments) as keyword arguments for the stock forward."""
    kw = dict(bound)
    if "cache" not in _positional_names(stock_forward):
        kw["past_key_values"] = kw.pop("cache")
    return kw
