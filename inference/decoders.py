"""Which static decoder runs a model: StaticDecoder (GPT-2's step, decode.py) or
LlamaStaticDecoder (decode_llama.py), by the model's adapter."""

from __future__ import annotations

from .adapters import adapter_for
from .decode import StaticDecoder
from .decode_llama import LlamaStaticDecoder


def decoder_class(model) -> type:
    """The model's static decoder class."""
    return StaticDecoder if adapter_for(model).static_decode else LlamaStaticDecoder


def decoder_for(model, *, batch_size: int, max_len: int):
    """The model's static decoder (decoder_class) for this batch size and length."""
    return decoder_class(model)(model, batch_size=batch_size, max_len=max_len)
