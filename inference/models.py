"""Loading a model (hub name, local directory, or random weights of a published shape) and
a tokenizer: GPT-2 and the Llama family (Llama, Qwen2, Mistral).

Nothing here reaches the network unless the model is neither a local directory
nor in the local HF cache; even then we first check that the hub answers,
because an unreachable hub otherwise costs ~30 s of retries before failing.
Constants live here (not in patch.py) so the CLI can validate arguments without
importing transformers.
"""

from __future__ import annotations

import os
from pathlib import Path

PRECISIONS = ("bf16", "fp8", "fp8-block", "int8", "int8-smoothquant")
# name -> (n_layer, n_embd, n_head); vocab 50257 and 1024 positions for all
GPT2_SIZES = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}
GPT2_VOCAB, GPT2_POSITIONS = 50257, 1024


# Random-weights configs of published Llama-family models: the values of each model's Hugging
# Face config.json (docs/llama-family-notes.md has the sources). Shapes agree with
# cute_kernels/tuning/models.py (tests/test_inference_llama.py checks N and K).
_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA_CONFIGS = {
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                          **_LLAMA3_SCALING}),
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=8192,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama-3-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=8192,
                        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          **_LLAMA3_SCALING}),
    # sliding_window is published as 131072 with use_sliding_window false: full attention.
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, max_position_embeddings=131072, use_sliding_window=False,
                       sliding_window=131072, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # Mistral-7B-v0.1 (the tuning table's shape): a 4096-token sliding window on every layer.
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=32768,
                       sliding_window=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}
LLAMA_FAMILY = ("llama", "qwen2", "mistral")  # model_type values patch_model runs (bf16)
SUPPORTED_TYPES = ("gpt2", *LLAMA_FAMILY)
# model_type -> the transformers class the CLI builds
CAUSAL_LM_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "mistral": "MistralForCausalLM"}


RANDOM_BANNER = "!!! RANDOM WEIGHTS: the model is {name}-shaped but untrained; text is gibberish, speed is real !!!"


class UserError(Exception):
    """Bad input: the CLI prints the message as one line and exits non-zero."""


def size_name(name: str) -> str | None:
    """'openai-community/gpt2-xl' or 'gpt2-xl' -> 'gpt2-xl'; None if not a GPT-2 size."""
    base = name.rstrip("/").split("/")[-1].lower()
    return base if base in GPT2_SIZES else None


def llama_name(name: str) -> str | None:
    """'meta-llama/Llama-3.2-1B' or 'llama-3.2-1b' -> 'llama-3.2-1b'; None if not in LLAMA_CONFIGS."""
    base = name.rstrip("/").split("/")[-1].lower()
    base = {"meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b",
            "mistral-7b-v0.1": "mistral-7b"}.get(base, base)
    return base if base in LLAMA_CONFIGS else None


def llama_config(name: str):
    """The transformers config of a LLAMA_CONFIGS entry (random weights of that shape)."""
    from transformers import AutoConfig

    kw = dict(LLAMA_CONFIGS[name])
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


def max_positions(config) -> int:
    return config.n_positions if getattr(config, "model_type", None) == "gpt2" else config.max_position_embeddings


def size_of(config) -> str | None:
    """The GPT-2 size name whose shapes `config` has (a local checkpoint of gpt2-xl is 'gpt2-xl')."""
    dims = (getattr(config, "n_layer", None), getattr(config, "n_embd", None), getattr(config, "n_head", None))
    if getattr(config, "model_type", None) != "gpt2" or getattr(config, "vocab_size", None) != GPT2_VOCAB:
        return None
    return next((name for name, d in GPT2_SIZES.items() if d == dims), None)


def gpt2_config(name: str):
    from transformers import GPT2Config

    n_layer, n_embd, n_head = GPT2_SIZES[name]
    return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=GPT2_VOCAB,
                      n_positions=GPT2_POSITIONS)


def _hub_reachable(timeout: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        from huggingface_hub import constants

        host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    except (ImportError, AttributeError, ValueError):
        host = "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_config(name: str, *, random_weights: bool):
    """The model's GPT2Config, from a local dir / HF cache / hub, or the hard-coded sizes."""
    from transformers import AutoConfig

    if Path(name).is_dir():
        try:
            cfg = AutoConfig.from_pretrained(name)
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"{name!r} is a directory but has no loadable model config ({type(e).__name__})") from e
    elif random_weights:
        if llama_name(name) is not None:
            return llama_config(llama_name(name))
        if size_name(name) is None:
            raise UserError(f"unknown model {name!r} for --random-weights; known sizes: "
                            f"{', '.join((*GPT2_SIZES, *LLAMA_CONFIGS))}")
        return gpt2_config(size_name(name))
    else:
        cfg = None
        try:
            cfg = AutoConfig.from_pretrained(name, local_files_only=True)
        except (OSError, ValueError, KeyError):
            if _hub_reachable():
                try:
                    cfg = AutoConfig.from_pretrained(name)
                except (OSError, ValueError, KeyError) as e:
                    raise UserError(f"cannot load model {name!r} from the hub ({type(e).__name__})") from e
        if cfg is None:
            hint = " or pass --random-weights" if size_name(name) or llama_name(name) else ""
            raise UserError(f"cannot load model {name!r}: not a local directory, not in the HF cache, and the hub "
                            f"is unreachable; give a local checkpoint directory{hint}")
    if getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        raise UserError(f"{name!r} is a {getattr(cfg, 'model_type', '?')} model; supported: GPT-2 and the Llama "
                        f"family ({', '.join(LLAMA_FAMILY)})")
    return cfg


def load_model(name: str, config, *, random_weights: bool, device, dtype):
    """The causal LM (GPT2LMHeadModel, LlamaForCausalLM, ...) in eval mode on `device` in `dtype`."""
    import importlib

    import torch

    # Only the model's own class: importing every architecture (AutoModel) costs startup time.
    cls = getattr(importlib.import_module("transformers"), CAUSAL_LM_CLASSES[config.model_type])
    if random_weights:
        torch.manual_seed(0)
        with torch.device(device):  # initialise on the target device: fast even for gpt2-xl
            model = cls(config)
        model = model.to(dtype)
    else:
        local = not Path(name).is_dir()
        try:
            model = cls.from_pretrained(name, dtype=dtype, local_files_only=local and not _hub_reachable())
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"cannot load weights of {name!r} ({type(e).__name__}: {str(e).splitlines()[0]})") from e
        model = model.to(device)
    return model.eval()


class ByteTokenizer:
    """Fallback when the model's tokenizer cannot be loaded: UTF-8 bytes are token ids 0..255."""

    name = "byte-level fallback"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
            else:  # not a byte: show the id
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(f"<{i}>")
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


def load_tokenizer(name: str):
    """(tokenizer, note): the model's tokenizer if it can be loaded locally or from the hub, else bytes."""
    tok = None
    try:
        from transformers import AutoTokenizer

        if Path(name).is_dir():
            tok = AutoTokenizer.from_pretrained(name)
        else:
            try:
                tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            except Exception:  # noqa: BLE001  (any failure: try the hub, then fall back to bytes)
                if _hub_reachable():
                    tok = AutoTokenizer.from_pretrained(name)
    except Exception:  # noqa: BLE001  (a broken or absent tokenizer is not fatal)
        tok = None
    # transformers 5 builds an *empty* tokenizer when the vocab files are missing: treat it as absent.
    if tok is not None and len(tok) >= 256 and tok.encode("hello world"):
        return tok, None
    return ByteTokenizer(), (f"no tokenizer for {name!r} could be loaded (no hub access, no local copy): "
                             f"using a byte-level tokenizer")


def check_positions(config, prompt_len: int, new_tokens: int):
    n = max_positions(config)
    if prompt_len + new_tokens > n:
        raise UserError(f"prompt ({prompt_len} tokens) + {new_tokens} new tokens = {prompt_len + new_tokens} "
                        f"exceeds the model's {n} positions")


# --precision -> the dtype cute_kernels.tune tunes for it (tuning.tune.DTYPES).
TUNE_DTYPES = {"bf16": "bf16", "fp8": "fp8", "fp8-block": "fp8-block", "int8": "int8", "int8-smoothquant": "int8"}


def tune_linears(model: str, config, precisions, ms) -> str:
    """Tune the GEMMs of the model's linears at row counts `ms` for `precisions`
    (cute_kernels.tune, GPU needed); returns a one-line summary."""
    size = size_name(model) or size_of(config)
    if size is None:
        return "note: --tune knows the GPT-2 sizes only; the GEMMs keep their configs"
    import cute_kernels

    results = cute_kernels.tune(model=size, dtypes=sorted({TUNE_DTYPES[p] for p in precisions}),
                                ms=sorted(set(ms)))
    if not results:
        return f"tuned: the {size} GEMMs at M = {', '.join(map(str, sorted(set(ms))))} were tuned already"
    gains = sorted(r.speedup for r in results)
    return (f"tuned {len(results)} {size} GEMM classes: {sum(g > 1 for g in gains)} beat the heuristic "
            f"(best {gains[-1]:.2f}x)")
