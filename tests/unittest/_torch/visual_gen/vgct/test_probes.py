"""Feature-active probes, fingerprints, poison, and the paired-experiment helpers on torch CPU tensors
(GPU variants marked ``gpu``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import vgct_ext  # noqa: E402
from vgct_ext.experiment import (  # noqa: E402
    Nondeterminism,
    capture,
    guard_inputs,
    load_reference,
    make_noise,
    run_twice,
    save_reference,
)
from vgct_ext.probes import (  # noqa: E402
    FeatureInactive,
    PlantedFaultNotCaught,
    assert_all_written,
    assert_feature_active,
    assert_same_weights,
    count_calls,
    count_unwritten,
    poison,
    weights_fingerprint,
    weights_fingerprints,
)
from vgct_ext.skips import requires_gpu  # noqa: E402


def _randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


class Block(torch.nn.Module):
    """A block whose 'feature' routes through an alternate path (gelu-tanh vs exact gelu)."""

    def __init__(self, fast: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 8)
        self.fast = fast
        self.used_fast_path = False

    def helper(self, x):
        return x * 2

    @staticmethod
    def stat(x):
        return x + 1

    @classmethod
    def klass(cls, x):
        return x - 1

    def forward(self, x):
        h = self.proj(x)
        if self.fast:
            self.used_fast_path = True
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.gelu(h)
        return self.out(h)


# ---------------------------------------------------------------------------------------------------------------
# feature delta


def test_feature_delta_passes_with_known_relative_l2():
    off = _randn(4, 64, dtype=torch.float64)
    on = off * (1 + 1e-3)
    r = assert_feature_active(component="c", feature="f", on=on, off=off, floor=1e-4)
    assert r.passed and r.stats.n_unequal == off.numel()
    assert r.stats.rel_l2 == pytest.approx(1e-3, rel=1e-9)


def test_feature_delta_fails_when_outputs_identical():
    off = _randn(4, 64)
    with pytest.raises(FeatureInactive) as ei:
        assert_feature_active(component="flux.block", feature="first block cache", on=off.clone(), off=off)
    msg = str(ei.value)
    assert "flux.block" in msg and "first block cache" in msg and "0 of 256 elements differ" in msg
    assert "bitwise" in msg and "FAIL feature delta" in msg


def test_feature_delta_below_floor_fails():
    off = _randn(1000)
    on = off.clone()
    on[0] += 1e-3  # one element: n_unequal = 1 but relative L2 tiny
    rel = abs(1e-3) / math.sqrt(float((off.double() ** 2).sum()))
    with pytest.raises(FeatureInactive, match=r"1 of 1000 elements differ .* relative L2"):
        assert_feature_active(component="c", feature="f", on=on, off=off, floor=10 * rel)
    assert_feature_active(component="c", feature="f", on=on, off=off, floor=rel / 10)


def test_feature_delta_against_zero_output():
    off = torch.zeros(8)
    assert_feature_active(component="c", feature="f", on=off + 1, off=off)
    with pytest.raises(FeatureInactive, match="zero norm"):
        assert_feature_active(component="c", feature="f", on=off.clone(), off=off)


def test_probe_needs_a_form_and_both_sides():
    with pytest.raises(TypeError, match="at least one form"):
        assert_feature_active(component="c", feature="f")
    with pytest.raises(TypeError, match="both on="):
        assert_feature_active(component="c", feature="f", on=torch.zeros(2))


# ---------------------------------------------------------------------------------------------------------------
# call counts


def test_count_calls_module_function_and_restores():
    b = Block(fast=True)
    original = F.gelu
    with count_calls(F, "gelu") as calls:
        b(_randn(2, 8))
        b(_randn(2, 8))
    assert calls.count == 2 and int(calls) == 2
    assert F.gelu is original
    assert_feature_active(component="c", feature="gelu path", calls=calls, min_calls=2)
    with pytest.raises(FeatureInactive, match=r"called 2 time\(s\) \(>= 3 required\)"):
        assert_feature_active(component="c", feature="f", calls=calls, min_calls=3)


def test_count_calls_module_forward_and_submodule_path():
    b = Block()
    seq = torch.nn.Sequential(b, torch.nn.Identity())
    with count_calls(b, "forward") as fwd, count_calls(seq, "0.out") as out, count_calls(b, "proj") as proj:
        seq(_randn(3, 8))
        seq(_randn(3, 8))
    assert (fwd.count, out.count, proj.count) == (2, 2, 2)
    assert not b._forward_pre_hooks  # hooks removed
    seq(_randn(3, 8))
    assert fwd.count == 2


def test_count_calls_instance_method_class_static_and_classmethods():
    b = Block()
    with count_calls(b, "helper") as c:
        b.helper(1)
        Block().helper(1)  # another instance: not counted
    assert c.count == 1 and "helper" not in b.__dict__
    with count_calls(Block, "helper") as c1, count_calls(Block, "stat") as c2, count_calls(Block, "klass") as c3:
        assert Block().helper(3) == 6 and Block.stat(1) == 2 and Block.klass(1) == 0 and b.stat(0) == 1
    assert (c1.count, c2.count, c3.count) == (1, 2, 1)
    assert isinstance(Block.__dict__["stat"], staticmethod) and isinstance(Block.__dict__["klass"], classmethod)


def test_count_calls_restores_on_error_and_rejects_missing():
    original = F.gelu
    with pytest.raises(RuntimeError):
        with count_calls(F, "gelu"):
            raise RuntimeError("boom")
    assert F.gelu is original
    with pytest.raises(AttributeError, match="no attribute or submodule 'nope'"):
        with count_calls(Block(), "nope"):
            pass
    with pytest.raises(TypeError, match="not callable"):
        with count_calls(Block(), "fast"):
            pass


# ---------------------------------------------------------------------------------------------------------------
# flags and sharding


def test_path_flag():
    b = Block(fast=True)
    b(_randn(1, 8))
    assert_feature_active(component="c", feature="fast", flag=(b, "used_fast_path"))
    with pytest.raises(FeatureInactive, match=r"Block.used_fast_path = False"):
        assert_feature_active(component="c", feature="fast", flag=(Block(), "used_fast_path"))


def test_probe_settings_that_can_never_fail_are_refused():
    """Planted (hostile review of 2026-12-05): min_calls=0 or -5 passed with no call, flag=(obj, "is_compiled")
    naming a method passed while the method returned False (a bound method is truthy), a negative floor was
    accepted.  Each is refused before anything is checked; a direct flag must be a boolean."""
    class Pipe:
        compiled = False

        def is_compiled(self):
            return False

    with count_calls(Block(), "forward") as calls:
        pass
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match="min_calls must be an integer >= 1"):
            assert_feature_active(component="c", feature="f", calls=calls, min_calls=bad)
    with pytest.raises(TypeError, match=r"Pipe.is_compiled is a method or other callable.*flag=obj.is_compiled\(\)"):
        assert_feature_active(component="c", feature="f", flag=(Pipe(), "is_compiled"))
    with pytest.raises(FeatureInactive, match=r"Pipe.compiled = False"):  # an attribute holding the flag: read
        assert_feature_active(component="c", feature="f", flag=(Pipe(), "compiled"))
    cfg = Pipe()
    cfg.compiled = "False"  # a config string: truthy, and says nothing
    for bad in ("False", b"False", [False], (False,), {"enabled": False}, np.array(["False"])):
        cfg.compiled = bad  # truthy, and says nothing
        with pytest.raises(TypeError, match=r"Pipe.compiled is \w+ .*whose truthiness says nothing"):
            assert_feature_active(component="c", feature="f", flag=(cfg, "compiled"))
    with pytest.raises(FeatureInactive, match=r"called 0 time\(s\) \(>= 2 required\)"):  # NumPy integers count
        assert_feature_active(component="c", feature="f", calls=calls, min_calls=np.int64(2))
    for bad in ("False", [0], 1, Pipe().is_compiled, torch.tensor([1, 0]), np.array([True, False])):
        with pytest.raises(TypeError, match="flag= takes True/False"):
            assert_feature_active(component="c", feature="f", flag=bad)
    for good, ok in ((np.bool_(False), False), (torch.tensor(True), True), (np.array([True]), True)):
        if ok:
            assert assert_feature_active(component="c", feature="f", flag=good).passed
        else:
            with pytest.raises(FeatureInactive):
                assert_feature_active(component="c", feature="f", flag=good)
    x = _randn(100)
    y = x.clone()
    y[0] += 1e-6
    for bad in (-1.0, math.nan, math.inf, "0"):
        with pytest.raises(ValueError, match="floor must be a finite relative L2 >= 0"):
            assert_feature_active(component="c", feature="f", on=y, off=x, floor=bad)


def test_sharding_state():
    full = _randn(2, 16, 8)
    local = full[:, :8]
    r = assert_feature_active(component="wan.attn", feature="ulysses", sharding=(local, full.shape, 1))
    assert "local shape (2, 8, 8) of global (2, 16, 8)" in r.forms[0][2]
    with pytest.raises(FeatureInactive, match="not sharded"):
        assert_feature_active(component="wan.attn", feature="ulysses", sharding=(full, full.shape, 1))
    with pytest.raises(TypeError):
        assert_feature_active(component="c", feature="f", sharding=full)


def test_all_forms_must_hold():
    off = _randn(8)
    with pytest.raises(FeatureInactive) as ei:
        assert_feature_active(component="c", feature="f", on=off * 2, off=off, flag=False)
    msg = str(ei.value)
    assert "ok   feature delta" in msg and "FAIL path flag" in msg


# ---------------------------------------------------------------------------------------------------------------
# fingerprints


def test_fingerprint_is_logical_and_weights_fingerprint_detects_changes():
    w = _randn(8, 4)
    strided = w.t().contiguous().t()  # same logical values, other strides
    assert vgct_ext.fingerprint(strided) == vgct_ext.fingerprint(w)
    a, b = Block(), Block()
    assert weights_fingerprint(a) == weights_fingerprint(b) == weights_fingerprint(b.state_dict())
    assert assert_same_weights(a, b, component="block") == weights_fingerprint(a)
    with torch.no_grad():
        b.out.weight[3, 5] += 1e-6
    assert weights_fingerprint(a) != weights_fingerprint(b)
    with pytest.raises(AssertionError, match=r"(?s)component 'block': 1 tensor\(s\) differ.*out.weight"):
        assert_same_weights(a, b, component="block")
    half = {k: v.half() for k, v in a.state_dict().items()}
    assert weights_fingerprint(half) != weights_fingerprint(a)
    transposed = dict(a.state_dict(), **{"out.weight": a.out.weight.detach().t().contiguous()})
    assert weights_fingerprints(transposed)["out.weight"] != weights_fingerprints(a)["out.weight"]
    with pytest.raises(AssertionError, match="only in the first"):
        assert_same_weights(a.state_dict(), {k: v for k, v in a.state_dict().items() if k != "proj.bias"},
                            component="block")


@requires_gpu()
def test_fingerprint_equal_on_cpu_and_gpu():
    w = _randn(33, 17, dtype=torch.bfloat16)
    assert vgct_ext.fingerprint(w.cuda()) == vgct_ext.fingerprint(w)
    b = Block()
    assert weights_fingerprint(Block().cuda()) == weights_fingerprint(b)


# ---------------------------------------------------------------------------------------------------------------
# poison / count_unwritten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.int32, torch.int8, torch.uint8, torch.int64])
def test_poison_then_count_unwritten(dtype):
    t = torch.empty(6, 10, dtype=dtype)
    assert poison(t) is t
    assert count_unwritten(t) == 60
    t[:, :7] = torch.ones(6, 7).to(dtype)  # a kernel that forgot the last 3 columns
    assert count_unwritten(t) == 18
    with pytest.raises(AssertionError, match=r"18 of 60 elements .* first at index \(0, 7\)"):
        assert_all_written(t, component="c", feature="f")
    t[:, 7:] = 0
    assert count_unwritten(t) == 0
    assert_all_written(t, component="c")


def test_poison_non_contiguous_view_and_legit_nan():
    base = torch.zeros(8, 8)
    view = base[:, ::2]
    poison(view)
    assert count_unwritten(base) == 32 and count_unwritten(view) == 32
    view.copy_(torch.full_like(view, float("nan")))  # a computed NaN is written, not the sentinel
    assert count_unwritten(view) == 0 and torch.isnan(view).all()


def test_poison_numpy_and_bad_types():
    a = np.empty((3, 4), np.float32)
    poison(a)
    a[0] = 1
    assert count_unwritten(a) == 8 and np.isnan(a[1:]).all()
    with pytest.raises(TypeError):
        poison(torch.zeros(2, dtype=torch.bool))
    with pytest.raises(TypeError):
        poison([1.0])


@requires_gpu()
def test_poison_on_gpu():
    t = poison(torch.empty(1000, device="cuda", dtype=torch.bfloat16))
    t[:999] = 1
    assert count_unwritten(t) == 1


# ---------------------------------------------------------------------------------------------------------------
# capture / replay, identical inputs


class Pipeline(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.pre = torch.nn.Linear(8, 8)
        self.block = block
        self.post = torch.nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        h = self.pre(x)
        for _ in range(3):
            h = self.block(h * scale)
        return self.post(h)


def test_capture_records_component_io_and_replays_to_both_sides():
    torch.manual_seed(1)
    pipe = Pipeline(Block())
    x = make_noise((2, 8), seed=3)
    with capture(pipe.block) as cap, torch.no_grad():
        pipe(x, scale=0.5)
    assert len(cap) == 3
    expected_in = pipe.pre(x).detach() * 0.5
    assert vgct_ext.fingerprint(cap.args[0]) == vgct_ext.fingerprint(expected_in)
    assert vgct_ext.fingerprint(cap.output) == vgct_ext.fingerprint(pipe.block(expected_in).detach())
    on, off = Block(fast=True), Block(fast=False)
    out_on, out_off = cap.replay(on, off, call=1)
    assert vgct_ext.fingerprint(out_off) == vgct_ext.fingerprint(cap.calls[1].output)
    assert on.used_fast_path and not off.used_fast_path
    r = assert_feature_active(component="block", feature="gelu tanh", on=out_on, off=out_off)
    assert r.stats.n_unequal > 0
    assert not pipe.block._forward_hooks and not pipe.block._forward_pre_hooks


def test_capture_stop_after_stops_the_pipeline_and_keeps_kwargs():
    class KwBlock(torch.nn.Module):
        def forward(self, x, *, t):
            return x + t

    class P(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blk = KwBlock()

        def forward(self, x):
            for i in range(5):
                x = self.blk(x, t=torch.tensor(float(i)))
            return x

    p = P()
    with count_calls(p.blk, "forward") as n, capture(p.blk, stop_after=2) as cap:
        p(torch.zeros(3))
    assert len(cap) == 2 and n.count == 2  # the pipeline stopped after the second call
    assert float(cap.calls[1].kwargs["t"]) == 1.0
    (out,) = cap.replay(KwBlock(), call=1)
    assert torch.equal(out, cap.calls[1].output)
    with pytest.raises(LookupError, match="never called"):
        with capture(KwBlock()) as empty:
            pass
        _ = empty.args


def test_make_noise_is_one_tensor_independent_of_global_rng():
    torch.manual_seed(123)
    a = make_noise((2, 3, 4), seed=7)
    torch.rand(100)
    b = make_noise((2, 3, 4), seed=7, dtype=torch.bfloat16)
    assert vgct_ext.fingerprint(a.to(torch.bfloat16)) == vgct_ext.fingerprint(b)
    assert make_noise((2, 3, 4), seed=8).ne(a).any()


def test_guard_inputs_detects_in_place_writes():
    x = make_noise((4,), seed=0)
    with guard_inputs(x, latents=x * 2):
        (x + 1).sum()
    with pytest.raises(AssertionError, match=r"modified in place.*input\[0\]"):
        with guard_inputs(x):
            x.add_(1)


# ---------------------------------------------------------------------------------------------------------------
# references through safetensors


def test_save_and_load_reference_round_trip(tmp_path):
    b = Block()
    out = _randn(2, 3, 8, dtype=torch.bfloat16)
    nc = _randn(8, 6).t()  # non-contiguous
    path = tmp_path / "ref.safetensors"
    info = save_reference(path, {"out": out, "nc": nc, "alias": out}, {"component": "wan.block", "seed": 0},
                          weights=b)
    ref = load_reference(path)
    assert ref.meta == {"component": "wan.block", "seed": 0}
    assert ref["out"].dtype == torch.bfloat16 and torch.equal(ref["out"], out) and torch.equal(ref["nc"], nc)
    assert "alias" in ref and set(ref.keys()) == {"out", "nc", "alias"}
    assert ref.weights_fingerprint == weights_fingerprint(b)
    assert ref.versions["torch"] == torch.__version__ and "safetensors" in ref.versions
    assert info["tensors"]["nc"]["shape"] == [6, 8] and info["tensors"]["out"]["dtype"] == "bfloat16"


def test_load_reference_rejects_foreign_and_tampered_files(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(p))
    with pytest.raises(ValueError, match="no 'vgct' metadata"):
        load_reference(p)
    q = tmp_path / "ref.safetensors"
    save_reference(q, {"x": torch.arange(4.0)})
    raw = bytearray(q.read_bytes())
    raw[-1] ^= 0x40  # flip a bit of the last value
    q.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="fingerprint"):
        load_reference(q)
    with pytest.raises(TypeError, match="JSON"):
        save_reference(tmp_path / "m.safetensors", {"x": torch.zeros(1)}, {"bad": object()})


# ---------------------------------------------------------------------------------------------------------------
# run twice


def test_run_twice_identical():
    b = Block()
    x = make_noise((2, 8), seed=0)
    r = run_twice(lambda v: (b(v), {"aux": v * 2}), x)
    assert r.identical and len(r.names) == 2 and r.fingerprints[0] == r.fingerprints[1]
    r.assert_identical(component="block", feature="eager")


def test_run_twice_reports_statistics_of_a_difference():
    state = {"n": 0}
    x = make_noise((256,), seed=0, dtype=torch.float64)

    def flaky(v):
        state["n"] += 1
        return v * (1 + 1e-6 * state["n"])  # run 2 differs: relative L2 of run2 vs run1 = 1e-6 / (1 + 1e-6)

    r = run_twice(flaky, x)
    assert not r.identical and r.fingerprints[0] != r.fingerprints[1]
    s = r.stats["out"]
    assert s.rel_l2 == pytest.approx(1e-6 / (1 + 1e-6), rel=1e-6)
    with pytest.raises(Nondeterminism, match=r"(?s)component 'c', feature 'f'.*out: fingerprints"):
        r.assert_identical(component="c", feature="f")


def test_run_twice_compares_every_leaf_by_path_and_refuses_an_output_it_cannot_compare():
    """Planted (hostile review of 2026-12-05): run_twice saw torch tensors only and matched leaves by position.
    An output of NumPy arrays (a pipeline's output_type="np") compared nothing, a nondeterministic float next to
    a tensor was ignored, and a dict whose values swapped keys between runs read identical.  Now each is
    nondeterministic; an output with nothing to compare by value raises TypeError."""
    x = make_noise((8,), seed=0)
    rng = np.random.default_rng(0)
    r = run_twice(lambda v: rng.standard_normal(4), x)
    assert not r.identical and r.names == ["out"] and "out" in r.stats  # NumPy arrays: fingerprints, statistics
    ref = np.asarray(r.outputs[0])
    assert r.stats["out"].max_abs_err == np.max(np.abs(np.asarray(r.outputs[1]) - ref))  # (oracle: NumPy)
    draws = iter([0.25, 0.5])
    r = run_twice(lambda v: (v * 2, next(draws)), x)
    assert not r.identical
    with pytest.raises(Nondeterminism, match=r"out\[1\]: 0.25 vs 0.5"):
        r.assert_identical(component="c", feature="f")
    n = [0]

    def swapped(v):
        n[0] += 1
        return {"a": v * 1, "b": v * 2} if n[0] == 1 else {"b": v * 1, "a": v * 2}

    r = run_twice(swapped, x)
    assert not r.identical and set(r.stats) == {"out.a", "out.b"}
    assert r.stats["out.a"].rel_l2 == pytest.approx(1.0) and r.stats["out.b"].rel_l2 == pytest.approx(0.5)
    m = []
    r = run_twice(lambda v: [v] * (m.append(0) or len(m)), x)  # one leaf, then two
    assert not r.identical and "differ in structure: only in run 1 [], only in run 2 ['out[1]']" in r.describe()
    same = run_twice(lambda v: {"x": v * 2, "t": np.float32(0.5), "s": "ok"}, x)
    assert same.identical
    # an object it cannot look into is never called identical (review: PIL images beside a bool read identical)
    r = run_twice(lambda v: {"x": v * 2, "obj": object()}, x)
    assert not r.identical and r.opaque == ["out.obj"] and "cannot compare out.obj" in r.describe()

    class Image:  # an array-like (as PIL's images: __array_interface__ / __array__), drawn anew each call
        def __init__(self):
            self.a = rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)

        def __array__(self, dtype=None, copy=None):
            return self.a

    @dataclasses.dataclass
    class Out:
        images: list
        step: int

    r = run_twice(lambda v: Out([Image()], 10), x)
    assert not r.identical and r.names == ["out.images[0]", "out.step"] and "out.images[0]" in r.stats
    assert run_twice(lambda v: Out([np.zeros((2, 2))], 10), x).identical
    assert run_twice(lambda v: (v * 2, v.dtype, v.device, v.shape, np.dtype("f4")), x).identical  # exact reprs
    palettes = iter([b"\x00" * 6, b"\x01" * 6])

    class PaletteImage(Image):  # a palette image's array holds indices: the palette is compared too
        def __init__(self):
            self.a = np.zeros((2, 2), np.uint8)

        def getpalette(self):
            return list(next(palettes))

    r = run_twice(lambda v: PaletteImage(), x)
    assert not r.identical and "out.palette" in r.describe()
    for nothing in (lambda v: None, lambda v: object(), lambda v: [None, object()]):
        with pytest.raises(TypeError, match="holds no tensor, array or scalar to compare"):
            run_twice(nothing, x)
    a = np.zeros(3)
    assert run_twice(lambda v: np.add(v, 1, out=v), a).inputs_changed == ["input[0]"]  # NumPy inputs too


def test_run_twice_detects_input_mutation():
    x = torch.zeros(4)
    r = run_twice(lambda v: v.add_(1), x)
    assert not r.identical and r.inputs_changed == ["input[0]"]


# ---------------------------------------------------------------------------------------------------------------
# probes for diffusers attention backends and torch.compile; expect_gate_failure; the package's names


def test_attention_backend_calls_counts_through_diffusers_registry():
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import (_AttentionBackendRegistry, attention_backend,
                                                     dispatch_attention_fn)

    from vgct_ext.probes import attention_backend_calls

    q = torch.randn(1, 6, 2, 8, generator=torch.Generator().manual_seed(0))  # (B, L, H, D) as diffusers passes
    before = dict(_AttentionBackendRegistry._backends)
    with attention_backend_calls("_native_math") as math_calls, attention_backend_calls("native") as native:
        with attention_backend("_native_math"):
            out = dispatch_attention_fn(q, q, q)
        with attention_backend("native"):
            ref = dispatch_attention_fn(q, q, q)
    assert (math_calls.count, native.count) == (1, 1) and "_native_math" in math_calls.name
    assert _AttentionBackendRegistry._backends == before  # restored
    # oracle: softmax(q k^T / sqrt(d)) v in float64
    qd = q.double().transpose(1, 2)
    want = torch.softmax(qd @ qd.transpose(-1, -2) / math.sqrt(8), -1) @ qd
    assert torch.allclose(out.double().transpose(1, 2), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ref, out, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not a diffusers attention backend"):
        with attention_backend_calls("no_such_backend"):
            pass


def test_compile_probe_counts_compiled_executions():
    from vgct_ext.probes import CompileProbe

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    probe = CompileProbe("eager")  # dynamo's eager backend: same graph capture, no inductor build (fast)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            cm = torch.compile(m, backend=probe)
            y1, y2 = cm(x), cm(x)
    finally:
        torch._dynamo.reset()
    assert probe.graphs == 1 and probe.calls.count == 2 and probe.graph_breaks == 0
    with torch.no_grad():
        assert torch.equal(y1, m(x)) and torch.equal(y2, y1)
    assert_feature_active(component="c", feature="compile", calls=probe.calls)
    idle = CompileProbe("eager")
    with pytest.raises(FeatureInactive):
        assert_feature_active(component="c", feature="compile", calls=idle.calls)  # never compiled: not run


def test_expect_gate_failure_checks_the_failing_statistics():
    from vgct_ext.gates import assert_t1, soft_gates
    from vgct_ext.probes import expect_gate_failure

    e = np.linspace(-1, 1, 64, dtype=np.float32)
    with expect_gate_failure(statistics=("rel_l2",), component="c") as caught:
        assert_t1(e * 1.01, e, component="c", feature="f")
    assert "rel_l2" in caught.failed and caught.error.stats.rel_l2 == pytest.approx(0.01, rel=1e-6)
    assert repr(caught).startswith("ExpectedFailure(failed=[") and "'rel_l2'" in repr(caught)
    assert "GateFailure: T1 gate failed" in repr(caught)  # the failure's first line, not an address
    with pytest.raises(PlantedFaultNotCaught, match="planted fault not caught") as ei:  # (an AssertionError)
        with expect_gate_failure():
            assert_t1(e * (1 + 2e-7), e, component="c", feature="f", name="near")
    assert isinstance(ei.value, AssertionError)
    # the message says how near the fault came: each gating statistic's value against its bar
    import re

    m = re.search(r"T1 gate c / f \[near\]: relative L2 (\S+) <= (\S+);", str(ei.value))
    assert m, str(ei.value)
    a64 = (e * (1 + 2e-7)).astype(np.float64)
    want = float(np.linalg.norm(a64 - e) / np.linalg.norm(e.astype(np.float64)))
    assert float(m.group(1)) == pytest.approx(want, rel=1e-6) and float(m.group(2)) == 2.0 ** -24 * 16
    from vgct_ext.probes import PLANTED_FAULT_FIX  # and what to try (a new-user trial: it said only that it passed)

    assert str(ei.value).endswith("\n" + PLANTED_FAULT_FIX) and "pass dim= (the channel axis)" in PLANTED_FAULT_FIX
    with pytest.raises(AssertionError, match=r"not on \['non_finite_pairs'\]"):
        with expect_gate_failure(statistics=("non_finite_pairs",)):
            assert_t1(e * 1.01, e, component="c", feature="f")
    with pytest.raises(AssertionError, match="does not name component 'other'"):
        with expect_gate_failure(component="other"):
            assert_t1(e * 1.01, e, component="c", feature="f")
    with soft_gates():  # gates raise inside expect_gate_failure even in soft mode; nothing left to collect
        with expect_gate_failure(statistics=("rel_l2",)):
            assert_t1(e * 1.01, e, component="c", feature="f")


def test_expect_gate_failure_does_not_hide_the_blocks_own_error():
    """Planted: inside a planted-fault block, a soft block collects the fault's gate failure and then
    the block's own code raises (a harness bug after the gate).  The soft block raises its
    GateFailure chained from that error (soft_gates never loses failures); expect_gate_failure
    must not count that as the fault caught and swallow the error: the error propagates (its
    contract: other exceptions propagate), with the gate failure as its context.  The same block
    without the error still counts as caught."""
    from vgct_ext.gates import GateFailure, assert_t1, soft_gates
    from vgct_ext.probes import expect_gate_failure

    e = np.linspace(-1, 1, 64, dtype=np.float32)
    with pytest.raises(ZeroDivisionError) as ei:
        with expect_gate_failure(statistics=("rel_l2",)):
            with soft_gates():
                assert_t1(e * 1.01, e, component="c", feature="f")
                1 / 0  # noqa: B018 -- the harness bug
    assert isinstance(ei.value.__context__, GateFailure)
    with pytest.raises(pytest.skip.Exception):  # a skip decided in the block stays a skip
        with expect_gate_failure(statistics=("rel_l2",)):
            with soft_gates():
                assert_t1(e * 1.01, e, component="c", feature="f")
                pytest.skip("decided inside the block")
    with expect_gate_failure(statistics=("rel_l2",)) as caught:
        with soft_gates():
            assert_t1(e * 1.01, e, component="c", feature="f")
    assert "rel_l2" in caught.failed


def test_package_lists_the_method_layer_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys, vgct_ext; names = set(vgct_ext.__all__); d = set(dir(vgct_ext)); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from vgct_ext import gates, probes, experiment, skips, sharded; "
            "want = set().union(*(m.__all__ for m in (gates, probes, experiment, skips, sharded))); "
            "assert want <= names and want <= d, sorted(want - names); "
            "assert {'assert_t1', 'soft_gates', 'expect_gate_failure', 'CompileProbe'} <= names; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gates_are_typed_to_return_paired_stats():
    import typing

    from vgct_ext.gates import assert_t1, assert_t2

    for fn in (assert_t1, assert_t2):
        hint = typing.get_type_hints(fn)["return"]
        assert vgct_ext.PairedStats in typing.get_args(hint) or hint is vgct_ext.PairedStats
