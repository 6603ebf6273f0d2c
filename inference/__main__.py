"""`python -m inference generate|bench ...` (see inference/cli.py)."""

import os
import sys

from .cli import main


def _run() -> None:
    rc = main()
    # A finished run needs nothing from the interpreter's teardown, which frees every CUDA graph,
    # tensor and loaded kernel module one by one (about 2 s after a GPT-2 run on an H100
    # machine): write what atexit would have written, flush, and leave.
    cache = sys.modules.get("cute_kernels.runtime.cache")
    if cache is not None:
        cache._record_at_exit()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":  # not when a spawned worker process imports this module
    _run()
