"""T1/T2 gates on constructed inputs with known statistics (float64 NumPy oracle).

Each gate passes and fails where the construction says it must, and every failure message carries the items
the method asks for: component, feature, both dtypes, shape, device/architecture, every statistic against its bar
with the margin, the worst element's index and values, the worst slice (with ``dim``), the non-finite counts.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from oracle import runs_within
from vgct_ext import evidence as ev
from vgct_ext.gates import (
    OUTER_BAND,
    T1_DEFAULT,
    GateFailure,
    Relax,
    TransparencyFinding,
    assert_t1,
    assert_t2,
    expect_evidence_missing,
    fmt_margin,
    fmt_value,
    resolve_t1_bars,
)


def _ref(shape=(4, 8, 16), seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _oracle(a, e):
    a = np.asarray(a, np.float64).ravel()
    e = np.asarray(e, np.float64).ravel()
    d = a - e
    rel = math.sqrt(math.fsum(d * d)) / math.sqrt(math.fsum(e * e))
    cos = math.fsum(a * e) / (math.sqrt(math.fsum(a * a)) * math.sqrt(math.fsum(e * e)))
    i = int(np.argmax(np.abs(d)))
    return rel, cos, i


def _row(msg, label):
    for line in msg.splitlines():
        if line.strip().startswith(label):
            return line
    raise AssertionError(f"no row {label!r} in:\n{msg}")


# ---------------------------------------------------------------------------------------------------------------
# bars and relax policy


def test_default_and_outer_band_are_the_methods_numbers():
    assert (T1_DEFAULT.rel_l2, T1_DEFAULT.cosine, T1_DEFAULT.rtol, T1_DEFAULT.atol) == (1e-2, 0.9999, 1e-3, 1e-3)
    assert (OUTER_BAND.rel_l2, OUTER_BAND.cosine) == (5e-2, 0.999)
    assert {m.value for m in Relax} == {"reduction reordering", "backend or kernel swap", "compile fusion",
                                        "parallel partial-sum merge"}


def test_relax_accepts_only_named_causes():
    assert Relax.parse("compile fusion") is Relax.COMPILE_FUSION
    assert Relax.parse("BACKEND_SWAP") is Relax.BACKEND_SWAP
    assert Relax.parse(Relax.PARALLEL_MERGE) is Relax.PARALLEL_MERGE
    e = _ref()
    with pytest.raises(ValueError, match="not a named accumulation cause") as ei:
        assert_t1(e, e, component="c", feature="f", relax="bf16 is noisy")
    for m in Relax:
        assert m.value in str(ei.value)


def test_looser_bar_without_cause_is_a_finding():
    e = _ref()
    with pytest.raises(TransparencyFinding, match="finding") as ei:
        assert_t1(e, e, component="wan.block", feature="sdpa", rel_l2=2e-2)
    msg = str(ei.value)
    assert "wan.block" in msg and "sdpa" in msg and "rel_l2" in msg and "no cause was named" in msg
    for kw in ({"cosine": 0.999}, {"rtol": 2e-3}, {"atol": 1e-2}):
        with pytest.raises(TransparencyFinding):
            assert_t1(e, e, component="c", feature="f", **kw)


def test_looser_than_outer_band_with_cause_is_a_finding():
    e = _ref()
    for kw in ({"rel_l2": 6e-2}, {"cosine": 0.99}, {"rtol": 0.1}, {"atol": 0.06}):
        with pytest.raises(TransparencyFinding, match="outer band") as ei:
            assert_t1(e, e, component="c", feature="f", relax=Relax.COMPILE_FUSION, **kw)
        assert "finding" in str(ei.value) and "compile fusion" in str(ei.value)


def test_bars_resolve_to_default_outer_band_or_request():
    assert resolve_t1_bars(None)[0] == T1_DEFAULT
    bars, cause = resolve_t1_bars("reduction reordering")
    assert bars == OUTER_BAND and cause is Relax.REDUCTION_REORDERING
    bars, _ = resolve_t1_bars(Relax.BACKEND_SWAP, rel_l2=2e-2, cosine=0.9995)
    assert (bars.rel_l2, bars.cosine, bars.rtol) == (2e-2, 0.9995, 5e-2)
    bars, _ = resolve_t1_bars(None, rel_l2=1e-5)  # tightening needs no cause
    assert bars.rel_l2 == 1e-5
    with pytest.raises(ValueError):
        resolve_t1_bars(None, cosine=1.5)
    with pytest.raises(TypeError):
        resolve_t1_bars(None, rel_l2=float("nan"))


# ---------------------------------------------------------------------------------------------------------------
# T1 on constructed inputs


def test_t1_passes_scaled_reference_with_exact_statistics():
    e = _ref()
    eps = 1e-4
    # float16 against a float64 reference: the design card's default bars (the float16 class caps them)
    a = (e * (1 + eps)).astype(np.float16)  # |a-e| <= (eps + 2^-11)|e| <= rtol|e|
    s = assert_t1(a, e, component="c", feature="f")
    rel, cos, _ = _oracle(a, e)
    assert s.rel_l2 == pytest.approx(rel, rel=1e-12)
    assert eps / 2 < s.rel_l2 < eps + 2.0 ** -11
    assert s.cosine == pytest.approx(cos, abs=1e-15)
    assert s.mismatches == 0 and s.rtol == 1e-3 and s.atol == 1e-3
    assert 0.99 in s.quantiles  # p99 always reported


def test_t1_fails_on_relative_l2_and_message_has_every_item():
    e = _ref((4, 8, 16))
    a = (e * (1 + 2e-2)).astype(np.float16)  # rel_l2 ~ 2e-2 > 1e-2, both dtypes differ (float16 class: 1e-2)
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="wan.transformer_block", feature="attention backend swap", dim=1)
    msg = str(ei.value)
    rel, _, i = _oracle(a, e)
    assert isinstance(ei.value, AssertionError)
    assert "component 'wan.transformer_block'" in msg and "feature 'attention backend swap'" in msg
    assert "actual float16 vs expected float64" in msg
    assert "shape (4, 8, 16)" in msg and "n=512" in msg
    assert re.search(r"device cpu \(\w+", msg)  # device and architecture
    row = _row(msg, "relative L2")
    assert fmt_value("rel_l2", rel) in row and "<= 1.0000e-02" in row and "FAIL" in row
    assert fmt_margin(1e-2 - ei.value.stats.rel_l2) in row
    assert "ok" in _row(msg, "cosine similarity") and ">= 0.99990000" in _row(msg, "cosine similarity")
    assert "FAIL" in _row(msg, "elements beyond atol+rtol*|e|")
    assert "max abs error" in msg and "p99 abs error" in msg
    idx = np.unravel_index(i, e.shape)
    assert f"worst element: index {tuple(int(x) for x in idx)}" in msg
    assert f"expected {float(e[idx]):.9g}" in msg and f"actual {float(a[idx]):.9g}" in msg
    # worst slice along dim 1: the one with the largest relative L2 (float64 oracle)
    d = a.astype(np.float64) - e
    per = np.sqrt((d ** 2).sum(axis=(0, 2))) / np.sqrt((e ** 2).sum(axis=(0, 2)))
    assert f"worst slice along dim 1 (= -2): index {int(np.argmax(per))} of 8" in msg  # 3-d: dim 1 is dim=-2
    assert "non-finite: actual NaN 0, +Inf 0, -Inf 0; expected NaN 0, +Inf 0, -Inf 0" in msg
    assert {c.statistic for c in ei.value.checks if not c.passed} == {"rel_l2", "mismatches"}


def test_t1_cosine_gate_with_orthogonal_error():
    e = _ref((4096,), seed=1)
    r = _ref((4096,), seed=2)
    r -= e * (r @ e) / (e @ e)  # orthogonal to e
    d = r / np.linalg.norm(r) * 0.046 * np.linalg.norm(e)
    # rel_l2 = 0.046 (inside the outer band), cosine = 1/sqrt(1 + 0.046^2) = 0.99894 < 0.999; in float16 against
    # the float64 reference, whose band for compile fusion is the outer band
    a = (e + d).astype(np.float16)
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="c", feature="f", relax=Relax.COMPILE_FUSION, rtol=5e-2, atol=5e-2)
    s = ei.value.stats
    rel, cos, _ = _oracle(a, e)
    assert s.rel_l2 == pytest.approx(rel, rel=1e-12) and 0.045 < rel < 0.047
    assert s.cosine == pytest.approx(cos, rel=1e-12) and cos < 0.999
    msg = str(ei.value)
    assert "ok" in _row(msg, "relative L2")
    assert "FAIL" in _row(msg, "cosine similarity") and ">= 0.99900000" in _row(msg, "cosine similarity")
    assert "(relax: compile fusion; bars for float16 vs float64" in msg


def test_t1_relaxed_passes_what_default_refuses():
    e = _ref()
    a = (e * (1 + 2e-2)).astype(np.float16)  # float16 vs float64: design card default, outer band relaxed
    with pytest.raises(GateFailure):
        assert_t1(a, e, component="c", feature="f")
    s = assert_t1(a, e, component="c", feature="f", relax="parallel partial-sum merge")
    assert s.rel_l2 == pytest.approx(_oracle(a, e)[0], rel=1e-12) and 0.019 < s.rel_l2 < 0.021


def test_t1_tightened_bar_fails():
    e = _ref()
    with pytest.raises(GateFailure, match="<= 1.0000e-05"):
        assert_t1((e * (1 + 1e-4)).astype(np.float16), e, component="c", feature="f", rel_l2=1e-5)


def test_the_max_relative_error_line_says_it_is_unbounded_near_zero():
    """The failure message's max relative error is |a-e|/|e| over e != 0 at the oracle's argmax -- here a
    near-zero reference element far from the planted bug -- and the line says why it may not point at it."""
    e = _ref((1000,))
    e[17] = 1e-9  # a near-zero reference
    a = e + 1e-7
    a[500] += 0.5  # the bug
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="c", feature="f")
    rel = np.where(e != 0, np.abs(a - e) / np.abs(np.where(e != 0, e, 1)), -1)
    k = int(np.argmax(rel))
    assert k == 17
    msg = str(ei.value)
    assert ("max relative error |a-e|/|e| (over e != 0; unbounded where e is near 0, so it need not point at "
            "the bug): ") in msg and f"at index ({k},)" in msg
    assert "worst element: index (500,)" in msg


def test_t1_elementwise_mismatch_fails_even_when_aggregates_pass():
    e = _ref((10000,))
    a = e.copy()
    a[1234] += 0.5  # one localized error: rel_l2 ~ 0.005, cosine > 0.9999
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="c", feature="f")
    s = ei.value.stats
    assert s.mismatches == 1 and s.rel_l2 < 1e-2 and s.cosine > 0.9999
    msg = str(ei.value)
    assert "worst element: index (1234,)" in msg and "worst mismatch: index (1234,)" in msg


def test_t1_non_finite_fails_with_counts():
    e = _ref((64,))
    a = e.copy()
    a[3] = np.nan
    a[5] = np.inf
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="c", feature="f")
    msg = str(ei.value)
    assert "FAIL" in _row(msg, "non-finite pairs") and " 2 " in _row(msg, "non-finite pairs")
    assert "actual NaN 1, +Inf 1, -Inf 0" in msg and "2 positions differ in class (first at (3,))" in msg


def test_t1_zero_reference_gates_on_absolute_error_and_says_so():
    e = np.zeros((3, 5))  # float16 against float64: atol is the design card's 1e-3
    s = assert_t1(np.full((3, 5), 5e-4, dtype=np.float16), e, component="c", feature="f")
    assert s.zero_reference and s.rel_l2 is None
    with pytest.raises(GateFailure) as ei:
        assert_t1(np.full((3, 5), 2e-3, dtype=np.float16), e, component="vae.decoder", feature="tiling")
    msg = str(ei.value)
    row = _row(msg, "max abs error")
    assert "zero-norm reference" in row and "absolute error" in row and "<= 1.0000e-03" in row and "FAIL" in row
    assert "relative L2 " not in msg.split("worst element")[0].replace("relative L2 and cosine", "")


def test_t1_empty_comparison_fails():
    with pytest.raises(GateFailure, match="empty comparison"):
        assert_t1(np.zeros((0, 3)), np.zeros((0, 3)), component="c", feature="f")


def test_t1_needs_names():
    e = _ref((4,))
    with pytest.raises(TypeError, match="component"):
        assert_t1(e, e, component="", feature="f")


def test_t1_torch_bf16_against_fp32_names_both_dtypes():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    e = torch.randn(2, 16, 64, generator=g)
    a = (e * 1.03).to(torch.bfloat16)
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="flux.single_block", feature="compile")
    msg = str(ei.value)
    assert "actual bfloat16 vs expected float32" in msg and "shape (2, 16, 64)" in msg
    rel, _, _ = _oracle(a.float().numpy(), e.numpy())
    assert ei.value.stats.rel_l2 == pytest.approx(rel, rel=1e-12)


@pytest.mark.gpu
def test_t1_on_gpu_names_architecture():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    e = torch.randn(1024, device="cuda")
    with pytest.raises(GateFailure) as ei:
        assert_t1(e * 1.05, e, component="c", feature="f")
    major, minor = torch.cuda.get_device_capability(0)
    assert f"cuda:0 (sm_{major}{minor}, {torch.cuda.get_device_name(0)})" in str(ei.value)


# ---------------------------------------------------------------------------------------------------------------
# T2


CPU_STRATUM = __import__("vgct_ext.method._hardware", fromlist=["stratum_of"]).stratum_of("cpu")  # "cpu-avx512", ...


def _write_evidence(path, key, stratum, entry):
    if isinstance(entry.get("bars"), dict) and "runs" not in entry:  # (a gate checks its bars against its runs)
        entry = dict(entry, runs=runs_within(entry["bars"]))
    data = {"format": ev.FORMAT, "entries": {key: {stratum: entry}}}
    path.write_text(json.dumps(data))


def _entry(a, e, bars, dim=None, **extra):
    a, e = np.asarray(a), np.asarray(e)
    d = {"dtype_actual": str(a.dtype), "dtype_expected": str(e.dtype), "shape": list(e.shape), "dim": dim,
         "bars": bars, "investigation": None}
    d.update(extra)
    return d


def test_t2_without_evidence_fails_and_says_how_to_record(tmp_path):
    e = _ref()
    path = tmp_path / "x.vgct-evidence.json"
    with expect_evidence_missing() as ei:
        assert_t2(e * 1.01, e, component="wan.block", feature="fp8 storage", evidence=path)
    msg = str(ei.value)
    assert not isinstance(ei.value, AssertionError)  # (a planted-fault check must not catch it: test_evidence_files)
    assert "no T2 evidence for 'wan.block | fp8 storage'" in msg and "pytest --vgct-calibrate" in msg
    assert "stratum cpu" in msg and "never from a default" in msg
    assert fmt_value("rel_l2", 0.01) in _row(msg, "relative L2")  # the measurement is still shown


def test_t2_without_an_evidence_file_names_the_path_it_looked_at(tmp_path, monkeypatch):
    """A relative ``evidence=`` path (written relative to the test's folder, run from the repository root) is
    resolved against the working directory at the gate: the message names the absolute path looked at and the
    directory, so that "no evidence" is not read as "not calibrated"; a link to nothing says so; an existing
    file without the key says neither."""
    e = _ref()
    (tmp_path / "run_here").mkdir()
    monkeypatch.chdir(tmp_path / "run_here")
    with expect_evidence_missing(match="no T2 evidence for 'c [|] f'") as ei:
        assert_t2(e, e, component="c", feature="f", evidence="ev/x.vgct-evidence.json")
    want = os.path.join(str(tmp_path), "run_here", "ev", "x.vgct-evidence.json")
    assert (f": no such file ({want}; the relative evidence='ev/x.vgct-evidence.json' was resolved against the "
            f"working directory, {tmp_path / 'run_here'} -- Path(__file__).with_name(...) ties a file to the "
            f"test)") in str(ei.value)
    with expect_evidence_missing() as ei:
        assert_t2(e, e, component="c", feature="f", evidence=tmp_path / "abs.vgct-evidence.json")
    assert f": no such file ({tmp_path / 'abs.vgct-evidence.json'})." in str(ei.value)
    (tmp_path / "dangling.vgct-evidence.json").symlink_to(tmp_path / "gone.json")
    with expect_evidence_missing() as ei:
        assert_t2(e, e, component="c", feature="f", evidence=str(tmp_path / "dangling.vgct-evidence.json"))
    assert (f": a broken symbolic link ({tmp_path / 'dangling.vgct-evidence.json'} -> {tmp_path / 'gone.json'})."
            in str(ei.value))
    _write_evidence(tmp_path / "other.vgct-evidence.json", "c | g", "sm_90", _entry(e, e, {"rel_l2": 1.0}))
    with expect_evidence_missing() as ei:
        assert_t2(e, e, component="c", feature="f", evidence=tmp_path / "other.vgct-evidence.json")
    assert "no such file" not in str(ei.value) and "working directory" not in str(ei.value)


def test_t2_evidence_of_another_stratum_does_not_apply(tmp_path):
    e = _ref()
    path = tmp_path / "x.vgct-evidence.json"
    _write_evidence(path, "c | f", "sm_90", _entry(e, e, {"rel_l2": 1.0, "cosine": 0.5}))
    with expect_evidence_missing(match=r"no T2 evidence for stratum cpu-\w+ under .*recorded strata: sm_90"):
        assert_t2(e, e, component="c", feature="f", evidence=path)


def test_t2_gates_on_recorded_bars(tmp_path):
    e = _ref()
    a = e * (1 + 0.02)
    path = tmp_path / "x.vgct-evidence.json"
    bars = {"rel_l2": 0.03, "cosine": 0.999, "p99": 1.0, "max_abs_err": 1.0}
    _write_evidence(path, "c | f | t=0.5", CPU_STRATUM, _entry(a, e, bars))
    s = assert_t2(a, e, component="c", feature="f", case="t=0.5", evidence=path)
    assert s.rel_l2 == pytest.approx(0.02, rel=1e-9)
    a2 = e * (1 + 0.04)
    with pytest.raises(GateFailure) as ei:
        assert_t2(a2, e, component="c", feature="f", case="t=0.5", evidence=path)
    msg = str(ei.value)
    row = _row(msg, "relative L2")
    assert "FAIL" in row and "<= 3.0000e-02" in row and fmt_margin(0.03 - ei.value.stats.rel_l2) in row
    assert "stratum cpu" in msg and "c | f | t=0.5" in msg
    assert "p99 abs error" in msg and "worst element" in msg and "non-finite" in msg


def test_t2_evidence_for_other_dtype_or_shape_is_refused(tmp_path):
    e = _ref()
    path = tmp_path / "x.vgct-evidence.json"
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e.astype(np.float32), e, {"rel_l2": 1.0}))
    with expect_evidence_missing(match="different experiment.*dtype_actual"):
        assert_t2(e, e, component="c", feature="f", evidence=path)


def test_t2_cosine_bar_under_floor_needs_investigation_note(tmp_path):
    e = _ref()
    path = tmp_path / "x.vgct-evidence.json"
    bars = {"rel_l2": 0.5, "cosine": 0.98, "p99": 10.0, "max_abs_err": 10.0}
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, bars))
    with expect_evidence_missing(match="investigation"):
        assert_t2(e * 1.1, e, component="c", feature="f", evidence=path)
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, bars, investigation="int4 weights: drift traced to ..."))
    assert_t2(e * 1.1, e, component="c", feature="f", evidence=path)


def test_t2_per_channel_mean_shift(tmp_path):
    e = _ref((2, 4, 32))
    a = e.copy()
    a[:, 2, :] += 0.01  # a shift of exactly 0.01 in channel 2
    path = tmp_path / "x.vgct-evidence.json"
    bars = {"rel_l2": 1.0, "cosine": 0.99, "p99": 1.0, "max_abs_err": 1.0, "channel_mean_shift": 0.005,
            "channel_rel_l2": 1.0}
    _write_evidence(path, "c | fp8", CPU_STRATUM, _entry(a, e, bars, dim=1))
    with pytest.raises(GateFailure) as ei:
        assert_t2(a, e, component="c", feature="fp8", dim=1, evidence=path)
    row = _row(str(ei.value), "per-channel mean shift")
    assert "FAIL" in row and "channel 2" in row and fmt_value("x", 0.01) in row
    assert ei.value.failed_statistics == ["channel_mean_shift"]
    obs = ev.t2_statistics(ei.value.stats)
    assert obs["channel_mean_shift"] == pytest.approx(0.01, rel=1e-9) and obs["channel_mean_shift_index"] == 2


def test_t2_failure_names_its_case_first(tmp_path):
    # several T2 gates in a soft block join their first lines: the case must come before the long statistic
    # text, not only in the evidence key at the end (new-user trial: pytest's short summary cut it off)
    e = _ref()
    path = tmp_path / "x.vgct-evidence.json"
    bars = {"rel_l2": 1e-3, "cosine": 0.99, "p99": 1.0, "max_abs_err": 1.0}
    _write_evidence(path, "c | f | image", CPU_STRATUM, _entry(e, e, bars))
    with pytest.raises(GateFailure) as ei:
        assert_t2(e * 1.1, e, component="c", feature="f", case="image", evidence=path)
    assert str(ei.value).startswith("T2 gate failed [image]: relative L2")
    with expect_evidence_missing() as ei:
        assert_t2(e * 1.1, e, component="c", feature="f", case="text", evidence=path)
    assert str(ei.value).startswith("T2 gate cannot run [text]: no usable calibration evidence")


def _channel_rel_l2_oracle(a, e, dim):
    """max_c ||a-e||_c / ||e||_c over the slices with ||e||_c > 0 (math.fsum, float64), and its channel."""
    a = np.moveaxis(np.asarray(a, np.float64), dim, 0)
    e = np.moveaxis(np.asarray(e, np.float64), dim, 0)
    vals = [(math.sqrt(math.fsum(((ac - ec) ** 2).ravel())) / math.sqrt(math.fsum((ec * ec).ravel())), c)
            for c, (ac, ec) in enumerate(zip(a, e)) if math.fsum((ec * ec).ravel()) > 0]
    return max(vals)


def test_t2_per_channel_rel_l2_catches_a_low_gain_channel_scale_error(tmp_path):
    # channel gains 1 .. 1e-2: a 20 % scale error in the quietest channel moves the global relative L2 by ~1e-3
    # (under its bar) and leaves the mean shift ~0 (zero-mean data), but is 20 % of that channel's own norm
    e = _ref((3, 6, 64)) * np.array([1, 0.5, 2, 1, 0.01, 1])[None, :, None]
    a = e * (1 + 1e-3 * _ref((3, 6, 64), seed=1))  # the feature's drift: ~1e-3 relative, every channel
    bad = a.copy()
    bad[:, 4, :] *= 1.2
    path = tmp_path / "x.vgct-evidence.json"
    clean_rel, clean_c = _channel_rel_l2_oracle(a, e, 1)
    bars = {"rel_l2": 2e-3, "cosine": 0.99999, "p99": 1.0, "max_abs_err": 1.0, "channel_mean_shift": 1.0,
            "channel_rel_l2": 1.5 * clean_rel}
    _write_evidence(path, "c | int8", CPU_STRATUM, _entry(a, e, bars, dim=1))
    s = assert_t2(a, e, component="c", feature="int8", dim=1, evidence=path)  # the clean pair passes
    obs = ev.t2_statistics(s)
    assert obs["channel_rel_l2"] == pytest.approx(clean_rel, rel=1e-12) and obs["channel_rel_l2_index"] == clean_c
    with pytest.raises(GateFailure) as ei:
        assert_t2(bad, e, component="c", feature="int8", dim=1, evidence=path)
    assert ei.value.failed_statistics == ["channel_rel_l2"]  # every global statistic passed the fault
    want, c = _channel_rel_l2_oracle(bad, e, 1)
    assert c == 4 and want == pytest.approx(0.2, rel=1e-2)
    row = _row(str(ei.value), "per-channel relative L2")
    assert "FAIL" in row and "channel 4" in row and fmt_value("x", want) in row
    assert ev.t2_statistics(ei.value.stats)["channel_rel_l2"] == pytest.approx(want, rel=1e-12)


def test_t2_per_channel_rel_l2_leaves_out_zero_reference_channels(tmp_path):
    e = _ref((2, 3, 8))
    e[:, 1, :] = 0.0  # a channel with no reference scale: no relative error; max_abs_err sees it
    a = e * 1.01
    a[:, 1, :] = 1e-6
    obs = ev.t2_statistics(__import__("vgct_ext").compare(a, e, dim=1))
    want, c = _channel_rel_l2_oracle(a, e, 1)
    assert obs["channel_rel_l2"] == pytest.approx(want, rel=1e-12) and obs["channel_rel_l2_index"] == c != 1


def test_t2_zero_reference_gates_on_absolute_error(tmp_path):
    e = np.zeros(16)
    path = tmp_path / "x.vgct-evidence.json"
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, {"max_abs_err": 1e-3, "p99": 1e-3}))
    with pytest.raises(GateFailure) as ei:
        assert_t2(np.full(16, 2e-3), e, component="c", feature="f", evidence=path)
    assert "zero-norm reference" in _row(str(ei.value), "max abs error")


def test_derive_bars_worst_plus_headroom():
    # identical runs: no spread, so the bar is the worst run plus headroom (the prediction bound equals the run)
    runs = [{"rel_l2": 0.02, "cosine": 0.9990, "p99": 0.1, "max_abs_err": 0.3, "channel_mean_shift": 0.004}] * 3
    worst, bars = ev.derive_bars(runs, 0.5)
    assert worst == {"rel_l2": 0.02, "cosine": 0.9990, "p99": 0.1, "max_abs_err": 0.3, "channel_mean_shift": 0.004}
    assert bars["rel_l2"] == pytest.approx(0.03) and bars["p99"] == pytest.approx(0.15)
    assert bars["cosine"] == pytest.approx(1 - 0.001 * 1.5) and bars["channel_mean_shift"] == pytest.approx(0.006)
    with pytest.raises(ValueError):
        ev.derive_bars(runs, -1)


def test_evidence_default_path_is_next_to_the_calling_module():
    assert ev.evidence_path() == __import__("pathlib").Path(__file__).with_name("test_gates.vgct-evidence.json")


@pytest.fixture(autouse=True)
def _gate_not_calibrate(monkeypatch):
    """These tests check gating; keep them gating even under ``pytest --vgct-calibrate``."""
    from vgct_ext.method import _context

    s = _context.current_session()
    if s is not None:
        monkeypatch.setattr(s, "calibrate", False)


def test_method_layer_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, vgct_ext, vgct_ext.gates, vgct_ext.probes, vgct_ext.experiment, vgct_ext.skips, "
            "vgct_ext.evidence, vgct_ext.plugin, vgct_ext.__main__; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(vgct_ext.assert_t1.__module__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "vgct_ext.method.gates"


# --- regression: T2 evidence must carry every gated bar; calibration refuses runs it cannot derive bars from


@pytest.mark.parametrize("bars, missing", [
    ({"max_abs_err": 10.0}, "rel_l2, cosine, p99"),
    ({"p99": 100.0}, "rel_l2, cosine, max_abs_err"),
    ({"rel_l2": 10.0, "p99": 10.0, "max_abs_err": 10.0}, "cosine"),
])
def test_t2_evidence_missing_a_bar_is_refused_not_skipped(tmp_path, bars, missing):
    e = _ref()
    a = e * 0.5  # cosine 1 but relative L2 0.5: would pass on the max-abs/p99 bars alone
    path = tmp_path / "x.vgct-evidence.json"
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(a, e, bars))
    with expect_evidence_missing() as ei:
        assert_t2(a, e, component="c", feature="f", evidence=path)
    msg = str(ei.value)
    assert f"no bar for {missing}" in msg and "pytest --vgct-calibrate" in msg and "Recalibrate" in msg


def test_t2_evidence_missing_channel_bar_with_dim_or_non_finite_bar_is_refused(tmp_path):
    e = _ref((2, 4, 8))
    path = tmp_path / "x.vgct-evidence.json"
    full = {"rel_l2": 1.0, "cosine": 0.99, "p99": 1.0, "max_abs_err": 1.0}
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, full, dim=1))
    with expect_evidence_missing(match="no bar for channel_mean_shift, channel_rel_l2"):
        assert_t2(e, e, component="c", feature="f", dim=1, evidence=path)
    # an entry recorded before the per-channel relative L2 was gated is refused, not gated without it
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, {**full, "channel_mean_shift": 1.0}, dim=1))
    with expect_evidence_missing(match=r"no bar for channel_rel_l2\. .*Recalibrate"):
        assert_t2(e * 1.5, e, component="c", feature="f", dim=1, evidence=path)
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, {**full, "rel_l2": None}))
    with expect_evidence_missing(match=r"bars\.rel_l2: expected a number, got None"):
        assert_t2(e, e, component="c", feature="f", evidence=path)


def test_t2_zero_reference_needs_only_absolute_bars_and_says_so(tmp_path):
    e = np.zeros(16)
    path = tmp_path / "x.vgct-evidence.json"
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, {"max_abs_err": 1e-3, "p99": 1e-3}))
    s = assert_t2(np.full(16, 5e-4), e, component="c", feature="f", evidence=path)
    assert s.zero_reference
    _write_evidence(path, "c | f", CPU_STRATUM, _entry(e, e, {"max_abs_err": 1e-3}))  # p99 is still required
    with expect_evidence_missing(match="no bar for p99.*reference has zero norm"):
        assert_t2(np.full(16, 5e-4), e, component="c", feature="f", evidence=path)
    # with dim: the per-channel mean shift is still required, the per-channel relative L2 is not (undefined)
    e2 = np.zeros((2, 8))
    _write_evidence(path, "c | f", CPU_STRATUM,
                    _entry(e2, e2, {"max_abs_err": 1e-3, "p99": 1e-3, "channel_mean_shift": 1e-3}, dim=0))
    s = assert_t2(np.full((2, 8), 5e-4), e2, component="c", feature="f", dim=0, evidence=path)
    assert s.zero_reference and ev.t2_statistics(s)["channel_rel_l2"] is None


def _calibrate(a, e, dim=None):
    from types import SimpleNamespace

    from vgct_ext import compare

    session = SimpleNamespace(calibration={})
    stats = compare(a, e, quantiles=(0.99,), dim=dim)
    # (queued only, never written: any existing folder -- the run's own check refuses a missing one)
    ev.add_calibration_run(session, Path(tempfile.gettempdir()) / "x.vgct-evidence.json", "c | f", "cpu", stats,
                           ev.t2_statistics(stats), component="c", feature="f", case=None, dim=dim)
    return session


@pytest.mark.component("c")  # a paired test: a plain test's calibration run is refused before these checks
def test_calibration_refuses_zero_reference_non_finite_and_undefined_runs():
    e = _ref()
    assert len(_calibrate(e * 1.01, e).calibration) == 1  # a good run is queued
    with pytest.raises(ValueError, match="calibration of 'c | f' on cpu refused: the reference has zero norm"):
        _calibrate(np.full(16, 1e-3), np.zeros(16))
    a = e.copy()
    a.flat[3] = np.nan
    with pytest.raises(ValueError, match=r"refused: 1 of \d+ pairs are non-finite"):
        _calibrate(a, e)
    with pytest.raises(ValueError, match=r"refused: undefined or non-finite statistic\(s\) cosine=None"):
        _calibrate(np.zeros_like(e), e)


def test_derive_bars_never_writes_a_missing_or_non_finite_bar():
    good = {"rel_l2": 0.01, "cosine": 0.999, "p99": 0.1, "max_abs_err": 0.2}
    with pytest.raises(ValueError, match=r"rel_l2=nan"):
        ev.derive_bars([good, {**good, "rel_l2": float("nan")}], 0.5)
    with pytest.raises(ValueError, match=r"cosine=None"):
        ev.derive_bars([{k: v for k, v in good.items() if k != "cosine"}], 0.5)
    with pytest.raises(ValueError, match=r"channel_mean_shift=None, channel_rel_l2=None"):
        ev.derive_bars([good], 0.5, dim=1)
    with pytest.raises(ValueError, match=r"channel_rel_l2=None"):
        ev.derive_bars([{**good, "channel_mean_shift": 0.01}], 0.5, dim=1)
    with pytest.raises(ValueError, match=r"max_abs_err=inf"):
        ev.derive_bars([{**good, "max_abs_err": float("inf")}], 0.5)
    _, bars = ev.derive_bars([good], 0.5)
    assert set(bars) == set(good) and all(math.isfinite(v) for v in bars.values())


@pytest.mark.parametrize("a, e", [(np.zeros(0), np.zeros(0)), (np.full(4, np.nan), np.full(4, np.nan))])
def test_t1_no_finite_pair_says_so_not_zero_norm(a, e):
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="c", feature="f")
    msg = str(ei.value)
    assert "no finite pair was compared" in msg and "zero-norm reference" not in msg


# ---------------------------------------------------------------------------------------------------------------
# relaxation scope: the band follows the cause and the dtypes (docs/method.md, "Relaxation scope")

from vgct_ext.gates import (  # noqa: E402
    COSINE_RESOLUTION,
    MIXED_FACTOR,
    T1_MULTIPLES,
    UNIT_ROUNDOFF,
    dtype_class,
    relaxation_table,
    soft_gates,
    t1_band,
)
from vgct_ext.probes import expect_gate_failure  # noqa: E402


def test_unit_roundoff_is_two_to_minus_significand_bits():
    # independent oracle: numpy's machine epsilon is 2u for binary formats (round to nearest)
    for name in ("float64", "float32", "float16"):
        assert UNIT_ROUNDOFF[name] == float(np.finfo(getattr(np, name)).eps) / 2
    assert UNIT_ROUNDOFF["bfloat16"] == 2.0 ** -8 and UNIT_ROUNDOFF["tfloat32"] == 2.0 ** -11
    assert UNIT_ROUNDOFF["float8_e4m3fn"] == 2.0 ** -4 and UNIT_ROUNDOFF["float8_e5m2"] == 2.0 ** -3


def test_dtype_class_is_the_coarser_dtype_and_says_mixed():
    c = dtype_class("bfloat16", "float32")
    assert (c.name, c.u, c.mixed) == ("bfloat16", 2.0 ** -8, True)
    c = dtype_class(np.float32, np.float32)
    assert (c.name, c.mixed) == ("float32", False)
    assert dtype_class("int64", "int64").name == "float64"  # exact dtypes: the finest class
    torch = pytest.importorskip("torch")
    assert dtype_class(torch.float16, torch.float64).name == "float16"
    with pytest.raises(TypeError, match="no unit roundoff"):
        dtype_class("complex64", "complex64")


def test_band_is_a_multiple_of_u_capped_by_the_design_card():
    f32, bf16 = dtype_class("float32", "float32"), dtype_class("bfloat16", "bfloat16")
    u = 2.0 ** -24
    for cause, (k_rel, k_elem) in T1_MULTIPLES.items():
        b = t1_band(cause, f32)
        assert b.rel_l2 == k_rel * u and b.rtol == b.atol == k_elem * u
        assert b.cosine == max(T1_DEFAULT.cosine if cause is None else OUTER_BAND.cosine,
                               1 - max((k_rel * u) ** 2, COSINE_RESOLUTION))
        # bfloat16 reaches the ceiling: the design card's default, or the outer band under a cause
        assert t1_band(cause, bf16) == (OUTER_BAND if cause is not None else T1_DEFAULT)
    # fp32 vs fp32 under any cause stays orders of magnitude inside the outer band
    for cause in Relax:
        assert t1_band(cause, f32).rel_l2 <= 2e-5 and t1_band(cause, f32).rtol <= 1e-4
    # a mixed pair is MIXED_FACTOR wider; no dtypes: the ceiling
    mixed = dtype_class("float32", "float64")
    assert t1_band(None, mixed).rel_l2 == MIXED_FACTOR * t1_band(None, f32).rel_l2
    assert t1_band(Relax.BACKEND_SWAP) == OUTER_BAND and t1_band(None) == T1_DEFAULT
    rows = relaxation_table()
    assert {r["cause"] for r in rows} == {"(none: T1 default)"} | {m.value for m in Relax}
    assert all(r["rel_l2"] <= 5e-2 and r["cosine"] >= 0.999 and r["rtol"] <= 5e-2 for r in rows)


@pytest.mark.parametrize("cause", list(Relax))
def test_fp32_request_looser_than_its_band_is_a_finding_even_inside_the_outer_band(cause):
    e = _ref().astype(np.float32)
    with pytest.raises(TransparencyFinding, match="looser than what") as ei:
        assert_t1(e, e, component="c", feature="f", relax=cause, rel_l2=5e-2)
    assert "float32" in str(ei.value) and cause.value in str(ei.value)
    with pytest.raises(TransparencyFinding, match="T1 default for float32"):
        assert_t1(e, e, component="c", feature="f", rtol=1e-3)  # the design card's 1e-3 is bf16's, not fp32's


@pytest.mark.parametrize("cause", list(Relax))
def test_planted_gain_error_passes_the_outer_band_but_fails_each_fp32_band(cause):
    """A 0.1% gain error (rel L2 1e-3) is inside the outer band every cause used to widen fp32 to; each cause's
    float32 band must fail it (on relative L2 and the elementwise check)."""
    e = _ref().astype(np.float32)
    a = (e * np.float32(1 + 1e-3)).astype(np.float32)
    rel = _oracle(a, e)[0]
    assert rel < OUTER_BAND.rel_l2 and np.all(np.abs(a - e) <= 5e-2 * (1 + np.abs(e)))
    with expect_gate_failure(statistics=("rel_l2", "mismatches"), component="c"):
        assert_t1(a, e, component="c", feature="f", relax=cause)


def test_planted_fault_reduction_reordering():
    """Reordered fp32 sum passes; the same reordered sum normalized by n+1 instead of n (an off-by-one count:
    rel L2 4.9e-4, max abs 1.2e-3, inside the outer band) fails the reordering band."""
    torch = pytest.importorskip("torch")
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    expected = x.sum(-1) / 1024 ** 0.5
    s = assert_t1(x.flip(-1).sum(-1) / 1024 ** 0.5, expected, component="rowsum", feature="reordered",
                  relax=Relax.REDUCTION_REORDERING)
    assert 0 < s.rel_l2 < 1e-6
    with expect_gate_failure(statistics=("rel_l2", "mismatches")):
        assert_t1(x.flip(-1).sum(-1) / 1025 ** 0.5, expected, component="rowsum", feature="reordered",
                  relax=Relax.REDUCTION_REORDERING)


def test_planted_fault_parallel_merge():
    """A split-K matmul merged from two fp32 partial sums passes; one partial communicated in bf16 (rel L2
    1.2e-3, max abs 7e-3: inside the outer band) fails the merge band."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(64, 512, generator=g) / 512 ** 0.5, torch.randn(512, 64, generator=g)
    expected = A @ B
    p0, p1 = A[:, :256] @ B[:256], A[:, 256:] @ B[256:]
    assert_t1(p0 + p1, expected, component="linear", feature="split-K", relax=Relax.PARALLEL_MERGE)
    with expect_gate_failure(statistics=("rel_l2", "mismatches")):
        assert_t1(p0.bfloat16().float() + p1, expected, component="linear", feature="split-K",
                  relax=Relax.PARALLEL_MERGE)


def test_planted_fault_fails_the_fp32_default_not_the_design_card():
    e = _ref().astype(np.float32)
    a = (e * np.float32(1 + 1e-5)).astype(np.float32)  # inside 1e-2 / 1e-3, outside 16u / 64u
    with expect_gate_failure(statistics=("rel_l2", "mismatches")):
        assert_t1(a, e, component="c", feature="f")


def test_bf16_default_keeps_the_design_card():
    torch = pytest.importorskip("torch")
    e = torch.randn(4096, generator=torch.Generator().manual_seed(3)).bfloat16()
    s = assert_t1(e, e.float(), component="c", feature="f", relax=Relax.BACKEND_SWAP)
    assert (s.rtol, s.atol) == (5e-2, 5e-2)
    with pytest.raises(GateFailure) as ei:  # bf16 rounding is beyond the design card's rtol = 1e-3
        assert_t1(e, e.float() * 1.002, component="c", feature="f")
    assert ei.value.stats.rtol == 1e-3


# ---------------------------------------------------------------------------------------------------------------
# labels, first line, slack, structures, soft mode


def test_first_line_names_failing_statistics_with_measured_and_bar():
    e = _ref()
    a = (e * 1.02).astype(np.float16)
    with pytest.raises(GateFailure) as ei:
        assert_t1(a, e, component="vae.decoder", feature="tiling", name="sample")
    first = str(ei.value).splitlines()[0]
    s = ei.value.stats
    assert first.startswith("T1 gate failed [sample]: relative L2 ")
    assert f"relative L2 {fmt_value('rel_l2', s.rel_l2)} (bar <= 1.0000e-02)" in first
    assert f"{s.mismatches} elements beyond atol+rtol*|e|" in first
    assert "cosine" not in first  # passed: not named
    assert "component 'vae.decoder', feature 'tiling'" in first
    assert ei.value.name == "sample" and ei.value.failed_statistics == ["rel_l2", "mismatches"]
    with pytest.raises(TypeError, match="name"):
        assert_t1(e, e, component="c", feature="f", name="")


def test_slack_is_the_smallest_bar_over_measured_ratio():
    from vgct_ext.method import _context
    from vgct_ext.gates import slack

    e = _ref()
    a = (e * (1 + 1e-4)).astype(np.float16)
    s = assert_t1(a, e, component="c", feature="f")
    checks = {"rel": s.rel_l2, "cos": s.cosine}
    want = min(1e-2 / checks["rel"], (1 - 0.9999) / (1 - checks["cos"]))
    sess = _context.Session()
    _context.push_session(sess)
    try:
        assert_t1(a, e, component="c", feature="f")
        assert_t1(e, e, component="c", feature="f")  # bitwise equal: no ratio
    finally:
        _context.pop_session(sess)
    r1, r2 = sess.records
    assert r1["slack"] == pytest.approx(want, rel=1e-12) and r1["name"] is None
    assert r2["slack"] is None
    assert slack([]) is None


def test_structures_gate_every_leaf_by_path():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, generator=g), torch.randn(3, generator=g)
    out = assert_t1((x, {"sample": y}), [x.clone(), {"sample": y.clone()}], component="c", feature="f")
    assert list(out) == ['out[0]', 'out[1]["sample"]'] and out["out[0]"].n == 64
    with pytest.raises(GateFailure) as ei:
        assert_t1({"a": x, "b": y * 1.5}, {"a": x, "b": y}, component="c", feature="f", name="blk")
    assert str(ei.value).splitlines()[0].startswith('T1 gate failed [blk["b"]]: relative L2')
    assert [f.name for f in ei.value.failures] == ['blk["b"]']
    with pytest.raises(ValueError, match=r'differ in keys at out: only in actual \[.a.\], only in expected \[.z.\]'):
        assert_t1({"a": x}, {"z": x}, component="c", feature="f")
    with pytest.raises(ValueError, match=r"differ in structure at out\[1\]: actual is a tuple of 1, expected a "
                                         r"tuple of 2"):
        assert_t1((x, (y,)), (x, (y, y)), component="c", feature="f")
    with pytest.raises(ValueError, match=r"at out\[1\].*a tensor pairs only with a tensor"):
        assert_t1((x, y), (x, None), component="c", feature="f")
    # several failing leaves: one GateFailure listing each
    with pytest.raises(GateFailure) as ei:
        assert_t1((x * 2, y * 2), (x, y), component="c", feature="f")
    first = str(ei.value).splitlines()[0]
    assert first.startswith("2 T1 gates on leaves") and "[out[0]]" in first and "[out[1]]" in first


def test_soft_gates_run_every_gate_then_raise_one_failure():
    e = _ref().astype(np.float32)
    ran = []
    with pytest.raises(GateFailure) as ei:
        with soft_gates() as failures:
            assert_t1(e * 1.01, e, component="c", feature="f", name="first")
            ran.append(1)
            assert_t1(e, e, component="c", feature="f", name="clean")
            assert_t1(e * 1.02, e, component="c", feature="g", name="third")
            ran.append(2)
            assert len(failures) == 2
    assert ran == [1, 2]
    assert [f.name for f in ei.value.failures] == ["first", "third"]
    first = str(ei.value).splitlines()[0]
    assert first.startswith("2 gates failed: T1 gate failed [first]: relative L2") and "[third]" in first
    with soft_gates():  # nothing failed: nothing raised
        assert_t1(e, e, component="c", feature="f")
    # an exception from the block itself, after a gate failed: the failure is raised, chained from it (a
    # pytest.raises around the block must not hide the failed gate); without a failure it propagates unchanged
    with pytest.raises(GateFailure) as ei:
        with pytest.raises(KeyError):  # planted: the test expects this error, the gate failure must still show
            with soft_gates():
                assert_t1(e * 1.01, e, component="c", feature="f")
                raise KeyError("x")
    assert isinstance(ei.value.__cause__, KeyError)
    with pytest.raises(KeyError):
        with soft_gates():
            assert_t1(e, e, component="c", feature="f")
            raise KeyError("x")


def _in_thread(fn):
    """Run ``fn`` in a new thread; return what it returned or raised."""
    import threading

    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


def test_soft_block_of_one_thread_does_not_swallow_another_threads_failure():
    # planted fault: a failing gate in thread B while thread A sits inside soft_gates() -- B's gate must raise in
    # B (its test fails), not be collected into A's block (with process-wide state B's gate returned, B passed)
    e = _ref().astype(np.float32)
    with pytest.raises(GateFailure) as ei:
        with soft_gates() as failures:
            out = _in_thread(lambda: assert_t1(e * 1.01, e, component="c", feature="other thread"))
            assert isinstance(out.get("error"), GateFailure), out
            assert failures == []  # nothing of thread B's in thread A's block
            assert_t1(e * 1.02, e, component="c", feature="this thread")
    assert "this thread" in str(ei.value) and "other thread" not in str(ei.value)


def test_expect_gate_failure_of_one_thread_does_not_mark_another_threads_gates():
    # a planted-fault block in thread A must not make thread B's gates raise through soft mode nor mark B's
    # records as expected failures
    e = _ref().astype(np.float32)
    with soft_gates() as failures:
        with expect_gate_failure(statistics=("rel_l2",), component="c"):
            out = _in_thread(lambda: _soft_failure_count(e))
            assert_t1(e * 1.01, e, component="c", feature="planted")
    assert out == {"value": 1}, out
    assert failures == []


def _soft_failure_count(e):
    """A failing gate inside this thread's own soft block: collected there (1), not raised."""
    from vgct_ext.method import gates as g

    with pytest.raises(GateFailure):
        with soft_gates() as mine:
            assert_t1(e * 1.01, e, component="c", feature="thread B")
            n = len(mine)
            assert not g._expecting(), "thread A's expect_gate_failure leaked into thread B"
    return n


def test_soft_block_copied_into_another_threads_context_does_not_collect_its_failures():
    # a thread that runs in a copy of the soft block's context (what Python 3.14's free-threaded builds do for
    # every new thread) still raises its own failing gate: the copied collector belongs to the first thread
    import contextvars

    e = _ref().astype(np.float32)
    with soft_gates() as failures:
        ctx = contextvars.copy_context()
        with expect_gate_failure(statistics=("rel_l2",)):
            ctx2 = contextvars.copy_context()
            assert_t1(e * 1.01, e, component="c", feature="planted")
        out = _in_thread(lambda: ctx.run(assert_t1, e * 1.01, e, component="c", feature="copied context"))
        out2 = _in_thread(lambda: ctx2.run(_expecting_now))
    assert isinstance(out.get("error"), GateFailure), out
    assert failures == []
    assert out2 == {"value": False}, out2


def _expecting_now():
    from vgct_ext.method import gates as g

    return g._expecting()


def test_soft_blocks_left_out_of_order_leave_no_collector_behind():
    # planted fault: __exit__ called by hand in the wrong order must not leave a collector on the stack, where it
    # would swallow every later failing gate of the thread
    e = _ref().astype(np.float32)
    outer, inner = soft_gates(), soft_gates()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    with pytest.raises(GateFailure):
        assert_t1(e * 1.01, e, component="c", feature="after the blocks")


def test_a_task_that_outlives_its_soft_block_raises_its_own_failure():
    # an asyncio task created inside a soft block copies its context; a failing gate that runs after the block
    # has ended must raise in the task, not be appended to the ended block's list
    import asyncio

    e = _ref().astype(np.float32)

    async def worker():
        await asyncio.sleep(0)
        assert_t1(e * 1.01, e, component="c", feature="late task")

    async def main():
        with soft_gates() as failures:
            task = asyncio.create_task(worker())
        with pytest.raises(GateFailure):
            await task
        return failures

    assert asyncio.run(main()) == []


def test_a_soft_block_left_in_another_thread_leaves_nothing_behind():
    # a generator that yields inside soft_gates(), started here and finished in another thread: the block ends in
    # the other thread's context, and this thread's later failing gates must still raise
    e = _ref().astype(np.float32)

    def steps():
        with soft_gates():
            yield 1
        yield 2

    g = steps()
    next(g)
    assert _in_thread(lambda: next(g)) == {"value": 2}
    with pytest.raises(GateFailure):
        assert_t1(e * 1.01, e, component="c", feature="after the block")


def test_a_planted_fault_block_left_in_another_thread_marks_nothing_afterwards():
    from vgct_ext.method import gates as g

    e = _ref().astype(np.float32)

    def steps():
        with expect_gate_failure(statistics=("rel_l2",)):
            yield 1
            assert_t1(e * 1.01, e, component="c", feature="planted")  # runs in the other thread
        yield 2

    it = steps()
    next(it)
    assert g._expecting() is True and g._planted_open() is True
    assert _in_thread(lambda: (next(it), g._expecting())) == {"value": (2, False)}
    assert g._expecting() is False and g._planted_open() is False
    with pytest.raises(GateFailure):
        assert_t1(e * 1.01, e, component="c", feature="after the block")


def test_a_soft_block_closed_by_generator_exit_reports_its_failures():
    # planted fault: a generator that gates inside soft_gates() and is abandoned mid-way (`for ... break`): the
    # block ends by GeneratorExit, where its collected failure cannot be raised -- it is warned about at once and
    # kept for the pytest plugin, which fails the test (below: taken back by hand so this test can check it)
    from vgct_ext.method import gates as g

    e = _ref().astype(np.float32)

    def layers():
        with soft_gates():
            for k in range(3):
                assert_t1(e * 1.01, e, component="c", feature=f"layer {k}")
                yield k

    with pytest.warns(RuntimeWarning, match="ended by GeneratorExit had collected gate failures"):
        for _ in layers():
            break
    state = g._test_begin()
    lost = g._test_end(state)
    assert len(lost) == 1 and "layer 0" in lost[0], lost
    assert g._test_end(g._test_begin()) == []  # reported once


def test_ambiguous_gate_is_importable_where_the_other_gate_errors_are():
    """docs/method.md: everything a gate raises is importable from vgct_ext.gates and vgct_ext; AmbiguousGate
    (a second gate of one key in one run) was only in vgct_ext.evidence (new-user trial of 2026-12-05)."""
    from vgct_ext import AmbiguousGate as top
    from vgct_ext.evidence import AmbiguousGate as home
    from vgct_ext.gates import AmbiguousGate as gates_one

    assert top is gates_one is home and issubclass(top, ValueError)
