"""The visual_gen component tests' environment fixture.

No diffusers import here: each model folder's conftest.py loads this even where diffusers is absent, and the test
modules then skip themselves through ``_components`` (``pytest.importorskip("diffusers")``).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def component_test_env():
    """One intra-op CPU thread for the duration of each component test, then restored.

    The components are tiny: with several threads, OpenMP spin/wake overhead dominates (measured 17 ms for a
    16 x 64 x 64 linear on a busy 2-core machine against 0.05 ms on one thread), and one thread also keeps the
    CPU results run-to-run reproducible for ``--vgct-repeat``.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
