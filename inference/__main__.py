"""`python -m inference generate|bench ...` (see inference/cli.py)."""

import sys

from .cli import main

sys.exit(main())
