"""hack/images.py (and hack/cuda_pins.py) as modules for the tests here (imported by name: `conftest` is ambiguous when pytest collects
this folder together with tests/operator, which has its own conftest)."""

from __future__ import annotations

import importlib.util

from suite_helpers import ROOT

_spec = importlib.util.spec_from_file_location("rlt_images", ROOT / "hack" / "images.py")
images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(images)

_pins_spec = importlib.util.spec_from_file_location("rlt_cuda_pins", ROOT / "hack" / "cuda_pins.py")
pins = importlib.util.module_from_spec(_pins_spec)
_pins_spec.loader.exec_module(pins)
