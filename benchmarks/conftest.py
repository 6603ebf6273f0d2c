import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import pytest_collection_modifyitems  # noqa: E402,F401  (same GPU gating as tests/)
