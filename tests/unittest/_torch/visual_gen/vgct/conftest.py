"""Shared fixtures of the vgct_ext library tests (engine, statistics, quantiles, slices)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # oracle.py, _cengine.py

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "vgct", deadline=None, max_examples=int(os.environ.get("VGCT_HYPOTHESIS_EXAMPLES", "60")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile("vgct")
except ImportError:  # hypothesis tests skip themselves
    pass


@pytest.fixture(scope="session")
def cengine():
    """The ctypes test build of csrc/cpu_engine.c (skips without a C compiler)."""
    import _cengine

    eng = _cengine.load()
    if eng is None:
        pytest.skip("no C compiler for the engine test build")
    yield eng
    eng.configure()


@pytest.fixture
def engine(cengine):
    """cengine with its knobs reset after the test."""
    cengine.configure()
    yield cengine
    cengine.configure()


@pytest.fixture
def run(pytester, request):
    """Run pytest in-process on pytester's directory, loading the plugin explicitly if it is not autoloaded
    (for the modules that enable ``pytester``: test_plugin.py, test_evidence_files.py)."""
    extra = [] if request.config.pluginmanager.has_plugin("vgct") else ["-p", "vgct_ext.plugin"]

    def _run(*args):
        return pytester.runpytest(*extra, "-p", "no:cacheprovider", *args)

    return _run
