"""Loading GPT-2 (hub name, local directory, or random weights) and a tokenizer.

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


RANDOM_BANNER = "!!! RANDOM WEIGHTS: the model is {name}-shaped but untrained; text is gibberish, speed is real !!!"


class UserError(Exception):
    """Bad input: the CLI prints the message as one line and exits non-zero."""


def size_name(name: str) -> str | None:
    """'openai-community/gpt2-xl' or 'gpt2-xl' -> 'gpt2-xl'; None if not a GPT-2 size."""
    base = name.rstrip("/").split("/")[-1].lower()
    return base if base in GPT2_SIZES else None


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
        if size_name(name) is None:
            raise UserError(f"unknown model {name!r} for --random-weights; known sizes: {', '.join(GPT2_SIZES)}")
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
            hint = " or pass --random-weights" if size_name(name) else ""
            raise UserError(f"cannot load model {name!r}: not a local directory, not in the HF cache, and the hub "
                            f"is unreachable; give a local checkpoint directory{hint}")
    if getattr(cfg, "model_type", None) != "gpt2":
        raise UserError(f"{name!r} is a {getattr(cfg, 'model_type', '?')} model; only GPT-2 is supported")
    return cfg


def load_model(name: str, config, *, random_weights: bool, device, dtype):
    """GPT2LMHeadModel in eval mode on `device` in `dtype`."""
    import torch
    from transformers import GPT2LMHeadModel

    if random_weights:
        torch.manual_seed(0)
        with torch.device(device):  # initialise on the target device: fast even for gpt2-xl
            model = GPT2LMHeadModel(config)
        model = model.to(dtype)
    else:
        local = not Path(name).is_dir()
        try:
            model = GPT2LMHeadModel.from_pretrained(name, dtype=dtype, local_files_only=local and not _hub_reachable())
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"cannot load weights of {name!r} ({type(e).__name__}: {str(e).splitlines()[0]})") from e
        model = model.to(device)
    return model.eval()


class ByteTokenizer:
    """Fallback when no GPT-2 tokenizer can be loaded: UTF-8 bytes are token ids 0..255."""

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
    return ByteTokenizer(), "no GPT-2 tokenizer could be loaded (no hub access, no local copy): using a byte-level tokenizer"


def check_positions(config, prompt_len: int, new_tokens: int):
    if prompt_len + new_tokens > config.n_positions:
        raise UserError(f"prompt ({prompt_len} tokens) + {new_tokens} new tokens = {prompt_len + new_tokens} "
                        f"exceeds the model's {config.n_positions} positions")


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
