"""Test-wide settings: a private model cache (tests build their tiny models themselves, never download)."""

import os
import tempfile

os.environ.setdefault("RLT_CACHE", tempfile.mkdtemp(prefix="rlt-test-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
