"""TensorRT comparison path: ONNX export, explicit Q/DQ, engine build and run.

Prefill: we export the *unpatched* model as a no-cache, full-sequence graph
(input_ids -> logits). Decode: `StaticCacheStep` is one greedy step over a static
KV cache with fixed shapes (input_ids [B, 1], position [B], the caches [L, B, H,
Smax, D] read-only) returning the logits and the step's new K/V rows, which the
caller writes into the cache (`DecodeEngine`). Fixed shapes need no optimization
profile over past lengths: positions past the filled length are masked instead.

Precision is explicit, the portable way across TensorRT 10 and 11 (11 removed
the FP16/INT8/FP8 builder flags): the network is built STRONGLY_TYPED, 16-bit
comes from exporting the model in bf16, and FP8/INT8 from QuantizeLinear ->
DequantizeLinear pairs (opset 19, symmetric, zero point 0) that we insert in
front of both inputs of every weight GEMM. Weights get per-output-channel
scales; activations get per-tensor scales calibrated with forward hooks on the
PyTorch model. Attention's two batched matmuls stay in 16-bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .adapters import adapter_for

OPSET = 19  # QuantizeLinear/DequantizeLinear-19 added float8e4m3fn
QMAX = {"int8": 127.0, "fp8": 448.0}


class LogitsOnly(nn.Module):
    """input_ids -> logits, no KV cache: the graph we export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


@torch.no_grad()
def export_onnx(model, path, example_ids: torch.Tensor, *, dynamic: bool = True) -> Path:
    """Export `model` (an unpatched GPT2LMHeadModel, attention "sdpa" or "eager") to ONNX.

    dynamic=True makes batch and sequence length symbolic (export with an example
    of at least 2 x 2: torch.export specialises sizes 0 and 1). Large models are
    written with external data next to `path`.
    """
    if getattr(model, "cute_patch", None):
        raise ValueError("export the unpatched model: TensorRT builds its own kernels")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    shapes = None
    if dynamic:
        dim = torch.export.Dim
        shapes = {"input_ids": {0: dim("batch", min=1, max=1024),
                                1: dim("seq", min=1, max=model.config.n_positions)}}
    torch.onnx.export(LogitsOnly(model).eval(), (example_ids,), str(path), dynamo=True, opset_version=OPSET,
                      dynamic_shapes=shapes, input_names=["input_ids"], output_names=["logits"],
                      external_data=True, verbose=False)
    return path


# --------------------------------------------------------------------------- static-cache decode step


class StaticCacheStep(nn.Module):
    """One decode step of an unpatched GPT2LMHeadModel over a static KV cache, in plain tensor
    ops (what TensorRT gets as ONNX):

        (input_ids [B, 1] int64, position [B] int64, k_cache, v_cache [L, B, H, Smax, D])
            -> logits [B, V] (float32), k_new, v_new [L, B, H, 1, D]

    Token b sits at position[b] and attends to cache rows 0..position[b]-1 plus its own key;
    cache rows at or past position[b] are ignored, whatever they hold (a finite fill value is
    assumed: masked scores are set, not added). Scores and softmax run in fp32. The caller
    writes k_new/v_new into row position[b] (DecodeEngine.step does) before the next step.
    """

    def __init__(self, model):
        super().__init__()
        if getattr(model, "cute_patch", None):
            raise ValueError("export the unpatched model: TensorRT builds its own kernels")
        cfg = model.config
        if cfg.add_cross_attention or getattr(cfg, "scale_attn_by_inverse_layer_idx", False) \
                or getattr(cfg, "reorder_and_upcast_attn", False):
            raise ValueError("StaticCacheStep covers GPT-2's default attention only")
        self.model = model
        self.adapter = adapter_for(model)
        self.n_head, self.head_dim = self.adapter.n_heads, self.adapter.head_dim

    def forward(self, input_ids, position, k_cache, v_cache):
        ad = self.adapter
        B = input_ids.shape[0]
        H, D = self.n_head, self.head_dim
        Smax = k_cache.shape[3]
        h = ad.embed(input_ids, position[:, None])  # [B, 1, E]
        valid = torch.arange(Smax, device=position.device)[None, :] < position[:, None]  # [B, Smax]
        valid = valid[:, None, None, :]  # [B, 1, 1, Smax]
        k_rows, v_rows = [], []
        for i, layer in enumerate(ad.layers()):
            x = layer.attn_norm(h)
            q, k, v = layer.qkv(x).split(H * D, dim=2)
            q, k, v = (t.reshape(B, 1, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, 1, D]
            s_cache = (q.float() @ k_cache[i].float().transpose(-1, -2)) * layer.attn_scale  # [B, H, 1, Smax]
            s_cache = torch.where(valid, s_cache, torch.finfo(torch.float32).min)
            s_self = (q.float() * k.float()).sum(-1, keepdim=True) * layer.attn_scale  # [B, H, 1, 1]
            p = torch.softmax(torch.cat([s_cache, s_self], dim=-1), dim=-1)
            o = p[..., :Smax] @ v_cache[i].float() + p[..., Smax:] * v.float()  # [B, H, 1, D]
            o = o.to(h.dtype).transpose(1, 2).reshape(B, 1, H * D)
            h = h + layer.out_proj(o)
            h = h + layer.mlp_out(layer.mlp_act(layer.mlp_in(layer.mlp_norm(h))))
            k_rows.append(k)
            v_rows.append(v)
        logits = ad.lm_head(ad.final_norm(h))[:, -1].float()
        return logits, torch.stack(k_rows), torch.stack(v_rows)


def static_cache_from_past(past_key_values, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face past key/values (a Cache or per-layer (k, v) pairs of [B, H, S, D]) -> zero-
    padded static caches [L, B, H, max_len, D]."""
    pairs = [(layer.keys, layer.values) for layer in past_key_values.layers] \
        if hasattr(past_key_values, "layers") else [tuple(p[:2]) for p in past_key_values]
    k0 = pairs[0][0]
    L, (B, H, S, D) = len(pairs), k0.shape
    if S > max_len:
        raise ValueError(f"{S} cached positions do not fit max_len {max_len}")
    kc = k0.new_zeros((L, B, H, max_len, D))
    vc = k0.new_zeros((L, B, H, max_len, D))
    for i, (k, v) in enumerate(pairs):
        kc[i, :, :, :S] = k
        vc[i, :, :, :S] = v
    return kc, vc


@torch.no_grad()
def export_decode_onnx(model, path, *, batch: int, max_len: int) -> Path:
    """Export StaticCacheStep(model) with fixed shapes (batch, max_len) to ONNX."""
    step = StaticCacheStep(model).eval()
    ad = step.adapter
    if not 1 <= max_len <= ad.max_positions:
        raise ValueError(f"max_len must be in [1, {ad.max_positions}], got {max_len}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    p = next(model.parameters())
    shape = (ad.n_layers, batch, ad.n_kv_heads, max_len, ad.head_dim)
    example = (torch.zeros(batch, 1, dtype=torch.long, device=p.device),
               torch.ones(batch, dtype=torch.long, device=p.device),
               torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device))
    torch.onnx.export(step, example, str(path), dynamo=True, opset_version=OPSET,
                      input_names=["input_ids", "position", "k_cache", "v_cache"],
                      output_names=["logits", "k_new", "v_new"], external_data=True, verbose=False)
    return path


# --------------------------------------------------------------------------- calibration


@torch.no_grad()
def calibrate_activations(model, batches) -> dict[str, float]:
    """Max |input| of every weight GEMM (Conv1D and lm_head), keyed by its weight's parameter name."""
    from transformers.pytorch_utils import Conv1D

    amax: dict[str, float] = {}
    hooks = []

    def hook(key):
        def fn(_module, args):
            v = float(args[0].detach().abs().max())
            amax[key] = max(amax.get(key, 0.0), v)

        return fn

    for name, mod in model.named_modules():
        if isinstance(mod, (Conv1D, nn.Linear)):
            hooks.append(mod.register_forward_pre_hook(hook(f"{name}.weight")))
    try:
        for ids in batches:
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return amax


def gemm_weights(model) -> dict[str, np.ndarray]:
    """Weight GEMM operands as [K, N] float32 arrays keyed like calibrate_activations (for value matching)."""
    from transformers.pytorch_utils import Conv1D

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Conv1D):
            out[f"{name}.weight"] = mod.weight.detach().float().cpu().numpy()
        elif isinstance(mod, nn.Linear):
            out[f"{name}.weight"] = mod.weight.detach().float().t().cpu().numpy()
    return out


# --------------------------------------------------------------------------- Q/DQ


def _find_key(init_name: str, array: np.ndarray, amax: dict, weights: dict | None) -> str | None:
    """Which module's weight an ONNX initializer is: by name, else (e.g. a folded transpose) by value."""
    for key in amax:
        if init_name == key or init_name.endswith("." + key):
            return key
    for key, w in (weights or {}).items():
        if key in amax and w.shape == array.shape and np.array_equal(w, array.astype(np.float32)):
            return key
    return None


def insert_qdq(model_proto, precision: str, act_amax: dict[str, float], weights: dict | None = None):
    """Add Q/DQ pairs on both inputs of every MatMul/Gemm whose B input is a known weight.

    Returns (model_proto, n_quantized). Scales are built in the graph's float
    type (QuantizeLinear-19 takes x and its scale in the same type).
    """
    from onnx import TensorProto, helper, numpy_helper

    if precision not in QMAX:
        raise ValueError(f"precision must be one of {tuple(QMAX)}, got {precision!r}")
    qmax = QMAX[precision]
    zp_type = TensorProto.INT8 if precision == "int8" else TensorProto.FLOAT8E4M3FN
    graph = model_proto.graph
    inits = {t.name: t for t in graph.initializer}
    new_inits, nodes, n_quant = [], [], 0

    def const(name, values, elem_type, dims):
        arr = np.asarray(values, np.float32).astype(helper.tensor_dtype_to_np_dtype(elem_type)).reshape(dims)
        new_inits.append(numpy_helper.from_array(arr, name))
        return name

    def qdq(tensor, prefix, scale, elem_type, axis=None):
        dims = [] if np.ndim(scale) == 0 else [int(np.size(scale))]
        s = const(f"{prefix}_scale", scale, elem_type, dims)
        z = const(f"{prefix}_zp", np.zeros(dims), zp_type, dims)
        kw = {} if axis is None else {"axis": axis}
        nodes.append(helper.make_node("QuantizeLinear", [tensor, s, z], [f"{prefix}_q"], name=f"{prefix}_Q", **kw))
        nodes.append(helper.make_node("DequantizeLinear", [f"{prefix}_q", s, z], [f"{prefix}_dq"],
                                      name=f"{prefix}_DQ", **kw))
        return f"{prefix}_dq"

    producer = {out: n for n in graph.node for out in n.output}

    def weight_of(tensor):
        """(B as an array in the layout the GEMM sees, initializer name), or None if not a constant weight."""
        if tensor in inits:
            return numpy_helper.to_array(inits[tensor]).astype(np.float32), tensor
        src = producer.get(tensor)  # e.g. lm_head: MatMul(x, Transpose(W))
        if src is not None and src.op_type == "Transpose" and src.input[0] in inits:
            perm = next((list(a.ints) for a in src.attribute if a.name == "perm"), None)
            return numpy_helper.to_array(inits[src.input[0]]).astype(np.float32).transpose(perm), src.input[0]
        return None

    for idx, node in enumerate(graph.node):
        found = weight_of(node.input[1]) if node.op_type in ("MatMul", "Gemm") and len(node.input) >= 2 else None
        key = _find_key(found[1], found[0], act_amax, weights) if found and found[0].ndim == 2 else None
        if key is not None:
            w, etype = found[0], inits[found[1]].data_type
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            axis = 0 if trans_b else 1  # the N axis of B as the GEMM reads it
            w_scale = np.maximum(np.abs(w).max(axis=1 - axis), 1e-12) / qmax
            a_scale = max(act_amax[key], 1e-12) / qmax
            p = f"qdq{idx}"
            x_dq = qdq(node.input[0], f"{p}_x", np.float32(a_scale), etype)
            w_dq = qdq(node.input[1], f"{p}_w", w_scale, etype, axis=axis)
            node.input[0], node.input[1] = x_dq, w_dq
            n_quant += 1
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    for op in model_proto.opset_import:
        if op.domain in ("", "ai.onnx") and op.version < OPSET:
            op.version = OPSET
    return model_proto, n_quant


def quantize_onnx(src, dst, precision: str, act_amax: dict, weights: dict | None = None) -> int:
    """Load src, insert Q/DQ, check, save dst (external data alongside); return #GEMMs quantized."""
    import onnx

    mp = onnx.load(str(src))
    mp, n = insert_qdq(mp, precision, act_amax, weights)
    dst = Path(dst)
    onnx.save_model(mp, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    onnx.checker.check_model(str(dst))
    return n


# --------------------------------------------------------------------------- TensorRT


def _trt():
    import tensorrt as trt  # raises ImportError where TensorRT is absent

    return trt


def build_engine(onnx_path, *, min_shape, opt_shape, max_shape, workspace_gib: int = 16) -> bytes:
    """Parse the ONNX file into a strongly typed network and build a serialized engine."""
    trt = _trt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_gib << 30)
    dynamic = [network.get_input(i) for i in range(network.num_inputs) if -1 in tuple(network.get_input(i).shape)]
    if dynamic:  # a profile only for symbolic inputs (a static export needs none)
        profile = builder.create_optimization_profile()
        for inp in dynamic:
            profile.set_shape(inp.name, min_shape, opt_shape, max_shape)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT engine build failed (see the TensorRT log above)")
    return bytes(plan)


class TRTRunner:
    """Runs a deserialized engine on torch tensors, on torch's current stream (name-based I/O)."""

    def __init__(self, plan: bytes):
        trt = _trt()
        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self._dtypes = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
                        trt.DataType.INT32: torch.int32, trt.DataType.INT8: torch.int8, trt.DataType.BOOL: torch.bool}
        for attr, dt in (("BF16", torch.bfloat16), ("INT64", torch.int64)):
            if hasattr(trt.DataType, attr):
                self._dtypes[getattr(trt.DataType, attr)] = dt

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One-input engines (the prefill graph): bind, run, return the first output."""
        want = self._dtypes[self.engine.get_tensor_dtype(self.inputs[0])]
        outs = self.bind({self.inputs[0]: input_ids.to(want).contiguous()})
        self.execute()
        return outs[self.outputs[0]]

    def bind(self, inputs: dict) -> dict:
        """Bind named input tensors (fixed addresses from now on) and allocate the outputs once;
        returns the outputs by name. Then `execute()` runs the engine on whatever they hold."""
        ctx = self.context
        missing = set(self.inputs) - set(inputs)
        if missing:
            raise ValueError(f"engine inputs not given: {sorted(missing)}")
        self._bound = {}
        for name in self.inputs:
            t = inputs[name]
            want = self._dtypes[self.engine.get_tensor_dtype(name)]
            if t.dtype != want or not t.is_contiguous():
                raise TypeError(f"engine input {name} must be a contiguous {want} tensor, got {t.dtype}")
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, t.data_ptr())
            self._bound[name] = t  # keep them alive: the engine holds raw addresses
        outs = {}
        dev = next(iter(inputs.values())).device
        for name in self.outputs:
            out = torch.empty(tuple(ctx.get_tensor_shape(name)), dtype=self._dtypes[self.engine.get_tensor_dtype(name)],
                              device=dev)
            ctx.set_tensor_address(name, out.data_ptr())
            outs[name] = out
        self._bound.update(outs)
        return outs

    def execute(self) -> None:
        # Read the stream on every call (a cached handle breaks CUDA-graph capture and stream switches).
        if not self.context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")


class DecodeEngine:
    """Greedy decoding on a TensorRT engine of StaticCacheStep (export_decode_onnx).

    The engine reads the static caches and returns the logits and the step's K/V rows; torch
    ops write those rows at each sequence's position, take the argmax and advance the
    position, all on the GPU without a host sync. `decode` replays one CUDA graph per step
    (as our StaticDecoder does) where the engine can be captured, else launches eagerly.
    """

    def __init__(self, runner: TRTRunner, k_cache: torch.Tensor, v_cache: torch.Tensor, first_token: torch.Tensor,
                 position: int):
        self.runner = runner
        self.k0, self.v0 = k_cache, v_cache  # the prompt's caches, kept to restart from
        self.k, self.v = k_cache.clone(), v_cache.clone()
        B = k_cache.shape[1]
        self.first, self.position0 = first_token.reshape(B, 1).long(), position
        self.tok = self.first.clone()
        self.pos = torch.full((B,), position, dtype=torch.long, device=k_cache.device)
        self.bidx = torch.arange(B, device=k_cache.device)
        self.out = runner.bind({"input_ids": self.tok, "position": self.pos, "k_cache": self.k, "v_cache": self.v})
        self.graph = None
        self.graph_note = ""

    def prefill(self, input_ids=None) -> None:
        """Restart from the prompt the caches were built for (the bench's decoder interface;
        the prompt itself is fixed at construction)."""
        self.reset()

    def reset(self) -> None:
        self.k.copy_(self.k0)
        self.v.copy_(self.v0)
        self.tok.copy_(self.first)
        self.pos.fill_(self.position0)

    def _step(self) -> None:
        self.runner.execute()
        k_new, v_new = self.out["k_new"], self.out["v_new"]  # [L, B, H, 1, D]
        self.k[:, self.bidx, :, self.pos] = k_new[:, :, :, 0].transpose(0, 1)
        self.v[:, self.bidx, :, self.pos] = v_new[:, :, :, 0].transpose(0, 1)
        self.tok.copy_(self.out["logits"].argmax(-1, keepdim=True))
        self.pos.add_(1)

    def decode(self, n_steps: int) -> None:
        if self.graph is None and not self.graph_note and not self.k.is_cuda:
            self.graph_note = "eager steps (CPU)"
        if self.graph is None and not self.graph_note:
            try:
                self._step()  # TensorRT allocates on its first enqueue: not inside the capture
                self.reset()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._step()
                self.graph = graph
                self.reset()
            except RuntimeError as e:  # not capturable on this TensorRT: eager launches, said in the report
                self.graph_note = f"eager steps (CUDA graph capture failed: {str(e).splitlines()[0][:80]})"
                torch.cuda.synchronize()
                self.reset()
        for _ in range(n_steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
