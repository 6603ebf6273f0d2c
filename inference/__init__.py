"""GPT-2 and Llama-family (Llama, Qwen2, Mistral) inference on cute_kernels: model patching,
a CUDA-graph decode loop (GPT-2), a CLI (`python -m inference generate|bench`) and a TensorRT
comparison path (GPT-2).

- `patch_model(model, precision=..., attention=..., backend=...)` (inference/patch.py)
- `StaticDecoder(model, batch_size=..., max_len=...)` (inference/decode.py)

Importing this package stays light (no transformers, no GPU query); the
submodules import what they need.
"""

__all__ = ["StaticDecoder", "patch_model"]


def __getattr__(name):
    if name == "patch_model":
        from .patch import patch_model

        return patch_model
    if name == "StaticDecoder":
        from .decode import StaticDecoder

        return StaticDecoder
    raise AttributeError(f"module 'inference' has no attribute {name!r}")
