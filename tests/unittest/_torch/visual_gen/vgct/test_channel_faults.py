"""Planted per-channel quantization faults against a calibrated T2 gate with ``dim=`` (the per-channel relative
L2 bar, evidence.t2_statistics).

The layer: a Linear(64 -> 128) whose output channels have log-normal gains (as real weights do), its weights
fake-quantized to int8 with one symmetric scale per output channel (s_c = max|W_c| / 127). The T2 experiment:
the quantized layer's output against the float64 layer's, both stored as float32, on 256 tokens of N(0, 1)
input. Bars come from five calibration seeds by the module's bar rule (evidence.derive_bars, default headroom
0.5), as ``pytest --vgct-calibrate`` derives them; the faults are gated without recalibrating, as a bug would be.

Faults, each planted in one channel c at a time, every channel:

* a 5 % scale error (s_c * 1.05): the global relative L2 and cosine dilute one channel's error by the other
  127 channels' energy, so a low-gain channel's error is invisible to them;
* a zero point off by one step (dequantize (q - 1) * s_c): with zero-mean inputs the output's mean shift stays ~0.

Without the per-channel relative L2 a new-user trial measured these passing in 37 % (scale) and 88 % (zero point)
of placements; the test asserts that each one now fails, on that statistic, naming the channel.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import vgct_ext
from vgct_ext.gates import GateFailure, assert_t2
from vgct_ext.method import evidence as ev
from vgct_ext.method._hardware import stratum_of

CHANNELS, FEATURES, TOKENS = 128, 64, 256
KEY = "toy.linear | int8 per-channel weights"


def _layer():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((CHANNELS, FEATURES)) * np.exp(rng.standard_normal((CHANNELS, 1)))
    scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
    wq = np.clip(np.round(w / scale), -127, 127) * scale
    return w, wq, scale


def _outputs(w_actual, w_ref, seed):
    x = np.random.default_rng(100 + seed).standard_normal((TOKENS, FEATURES))
    return (x @ w_actual.T).astype(np.float32), (x @ w_ref.T).astype(np.float32)


def _rel_l2_of_channel(a, e, c):
    d = a[:, c].astype(np.float64) - e[:, c].astype(np.float64)
    ec = e[:, c].astype(np.float64)
    return math.sqrt(math.fsum(d * d)) / math.sqrt(math.fsum(ec * ec))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """(path of the evidence file, w, wq, scale): bars from seeds 0..4 on this CPU stratum."""
    w, wq, scale = _layer()
    runs = []
    for seed in range(5):
        a, e = _outputs(wq, w, seed)
        obs = ev.t2_statistics(vgct_ext.compare(a, e, dim=1))
        runs.append({k: obs[k] for k in ev.UPPER + ("cosine",)})
    _, bars = ev.derive_bars(runs, 0.5, dim=1)
    path = tmp_path_factory.mktemp("ev") / "toy.vgct-evidence.json"
    entry = {"kind": "t2", "dtype_actual": "float32", "dtype_expected": "float32", "shape": [TOKENS, CHANNELS],
             "dim": 1, "bars": bars, "investigation": None, "runs": runs}
    path.write_text(json.dumps({"format": ev.FORMAT, "entries": {KEY: {stratum_of("cpu"): entry}}}))
    return path, w, wq, scale


def _gate(path, a, e):
    component, feature = KEY.split(" | ")
    return assert_t2(a, e, component=component, feature=feature, dim=1, evidence=path)


def test_clean_seeds_pass_the_calibrated_bars(calibrated):
    path, w, wq, _ = calibrated
    for seed in range(5, 15):  # seeds the bars never saw: no false alarm
        _gate(path, *_outputs(wq, w, seed))


@pytest.mark.parametrize("fault", ["scale +5%", "zero point +1 step"])
def test_a_fault_in_any_one_channel_fails_the_gate(calibrated, fault):
    path, w, wq, scale = calibrated
    only_per_channel = 0
    for c in range(CHANNELS):
        wb = wq.copy()
        if fault == "scale +5%":
            wb[c] *= 1.05
        else:
            wb[c] += scale[c]
        a, e = _outputs(wb, w, seed=5)
        with pytest.raises(GateFailure) as ei:
            _gate(path, a, e)
        failed = ei.value.failed_statistics
        assert "channel_rel_l2" in failed, (c, failed)
        row = next(ln for ln in str(ei.value).splitlines() if ln.strip().startswith("per-channel relative L2"))
        assert f"channel {c}" in row and "FAIL" in row, row
        got = ev.t2_statistics(ei.value.stats)["channel_rel_l2"]
        assert got == pytest.approx(_rel_l2_of_channel(a, e, c), rel=1e-12)  # the faulty channel's, not another's
        only_per_channel += failed == ["channel_rel_l2"]
    # most placements pass every global statistic: the per-channel relative L2 is what catches them
    assert only_per_channel > CHANNELS // 2, only_per_channel
