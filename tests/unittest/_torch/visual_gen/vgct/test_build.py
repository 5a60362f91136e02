"""The build (setup.py, pyproject.toml), build_info(), the package surface."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _C

ROOT = Path(__file__).resolve().parents[5]


def _no_gpu_here() -> bool:
    return not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0"))


def _pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_import_does_not_import_torch():
    code = ("import sys, vgct_ext; vgct_ext.build_info(); "
            "import numpy as np; vgct_ext.compare(np.zeros(3), np.zeros(3)); "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_torch_imported_after_vgct_ext_and_a_compare_is_recognised():
    """vgct_ext caches torch.Tensor once it finds torch (_dlpack._torch_of): a compare before
    torch is imported must not cache "no torch", and a float8 tensor, a Tensor subclass and a
    negated view made after the import must take torch's path (the float8 view, resolve_neg),
    with their values, not be refused or read unsigned."""
    code = textwrap.dedent("""
        import sys, numpy as np, vgct_ext
        class A(np.ndarray):  # (not a plain ndarray: it goes through the torch check)
            pass
        s = vgct_ext.compare(np.ones(3, np.float32).view(A), np.ones(3, np.float32))
        assert "torch" not in sys.modules and s.n == 3
        import torch
        x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float8_e4m3fn)
        s = vgct_ext.compare(x, torch.tensor([1.0, 2.0, 3.0]), quantiles=())
        assert (s.dtype_actual, s.max_abs_err, s.max_abs_err_index) == ("float8_e4m3fn", 1.0, (2,)), s
        class T(torch.Tensor):
            pass
        y = torch.tensor([1.0, -2.0]).as_subclass(T)
        s = vgct_ext.compare(y, torch.tensor([1.0, -2.0]), quantiles=())
        assert s.n_unequal == 0 and s.n == 2, s
        z = torch.tensor([1.0, 2.0])._neg_view()  # the negation bit: exported unsigned unless resolved
        s = vgct_ext.compare(z, torch.tensor([-1.0, -2.0]), quantiles=())
        assert s.n_unequal == 0, s
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_build_info_fields():
    bi = vgct_ext.build_info()
    assert bi["version"] == vgct_ext.__version__ == _C.__version__ == _pyproject()["project"]["version"]
    assert isinstance(bi["cuda_compiled"], bool)
    for k in ("cuda_runtime_version", "cuda_driver_version", "cuda_device_count", "max_threads"):
        assert isinstance(bi[k], int) and bi[k] >= 0, k
    assert bi["dlpack_version"] == "1.0"
    assert bi["max_threads"] >= 1
    # never the diagnostic build (VGCT_PHASE_TRACE=1: its kernels print on every launch)
    assert bi["phase_trace"] is False
    if bi["cuda_compiled"]:
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", bi["nvcc_version"])
        assert "-gencode arch=compute_" in bi["cuda_archs"]
        if not os.environ.get("VGCT_CUDA_ARCHS"):
            # default: sm_90 SASS plus compute_90 PTX
            assert bi["cuda_archs"] == ("-gencode arch=compute_90,code=sm_90 "
                                        "-gencode arch=compute_90,code=compute_90")
        assert bi["cuda_runtime_version"] >= 11000  # the static runtime answers without a driver
    else:
        assert bi["nvcc_version"] is None and bi["cuda_archs"] is None
        assert bi["cuda_runtime_version"] == bi["cuda_driver_version"] == bi["cuda_device_count"] == 0


def test_build_info_says_where_the_extension_was_loaded_from():
    """build_info names the _C file and the package folder; the pytest header warns when they are in different
    trees (an editable install of another checkout: this tree's Python with another tree's C code)."""
    from vgct_ext.method.plugin import _extension_note

    bi = vgct_ext.build_info()
    assert bi["extension_path"] == os.path.abspath(_C.__file__)
    assert bi["package_path"] == os.path.dirname(os.path.abspath(vgct_ext.__file__))
    assert os.path.dirname(bi["extension_path"]) == bi["package_path"]  # this tree's own build
    assert _extension_note(bi["package_path"], bi["extension_path"]) == ""
    other = os.path.join(os.sep, "elsewhere", "vgct_ext", os.path.basename(bi["extension_path"]))
    assert _extension_note(bi["package_path"], other) == (
        f"; WARNING: _C loaded from {other}, not from this package ({bi['package_path']})")


@pytest.mark.skipif(not _no_gpu_here(), reason="a GPU is present")
def test_build_info_without_gpu_reports_zero_devices():
    bi = vgct_ext.build_info()
    assert bi["cuda_device_count"] == 0
    if bi["cuda_compiled"]:
        with pytest.raises(ValueError, match=r"no CUDA device 0 \(device_count 0"):
            _C.device_props(0)


def test_device_props_on_cpu_only_build():
    if vgct_ext.build_info()["cuda_compiled"]:
        pytest.skip("CUDA build")
    with pytest.raises(RuntimeError, match="vgct_ext was built without CUDA; rebuild with nvcc available"):
        _C.device_props(0)


def _nvcc():
    """nvcc as setup.py's _find_nvcc finds it ($CUDA_HOME or $CUDA_PATH /bin, else PATH), or None."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def test_nvcc_presence_decides_cuda_build():
    """A tree with cuda/*.cu built where nvcc exists (and VGCT_CUDA != 0) has CUDA compiled in."""
    cu = list((ROOT / "cuda").glob("*.cu"))
    if not (cu and _nvcc()) or os.environ.get("VGCT_CUDA") == "0":
        pytest.skip("no nvcc or no cuda/*.cu, or VGCT_CUDA=0: CPU-only build expected")
    assert vgct_ext.build_info()["cuda_compiled"], "nvcc and cuda/*.cu present but the module has no CUDA"


def test_stub_matches_module():
    stub = (ROOT / "vgct_ext" / "_C.pyi").read_text()
    public = sorted(n for n in dir(_C) if not n.startswith("_") and callable(getattr(_C, n))
                    and not isinstance(getattr(_C, n), type))
    classes = sorted(n for n in dir(_C) if isinstance(getattr(_C, n), type))
    assert classes == ["InputChangedError"] and issubclass(_C.InputChangedError, RuntimeError)
    assert "class InputChangedError(RuntimeError):" in stub
    assert public == ["acc_fields", "build_info", "compare", "device_props", "finalize_raw",
                      "fingerprint", "histogram", "merge_raw", "merge_slices_raw",
                      "quantile_ranks", "rank_key_known", "reduce_raw", "remap_raw"]
    for n in public:
        assert f"def {n}(" in stub
    assert (ROOT / "vgct_ext" / "py.typed").exists()


def test_public_api():
    for n in ("compare", "PairedStats", "SliceStats", "fingerprint", "build_info", "__version__"):
        assert n in vgct_ext.__all__ and hasattr(vgct_ext, n)
    with pytest.raises(AttributeError):
        vgct_ext.does_not_exist  # noqa: B018


def test_pyproject_metadata():
    pp = _pyproject()
    proj = pp["project"]
    assert proj["name"] == "vgct_ext" and proj["version"] == "0.1.0"
    assert "numpy>=2.1" in proj["dependencies"]  # versioned DLPack (read-only flag) from numpy 2.1
    assert any(r.startswith("numpy>=2.1") for r in pp["build-system"]["requires"])
    assert pp["build-system"]["build-backend"] == "setuptools.build_meta"
    extras = proj["optional-dependencies"]
    assert set(extras["test"]) >= {"pytest", "hypothesis", "safetensors"}
    assert extras["torch"] == ["torch>=2.6"]
    assert "diffusers" in extras
    assert proj["entry-points"]["pytest11"] == {"vgct": "vgct_ext.plugin"}
    ini = pp["tool"]["pytest"]["ini_options"]
    assert ini["testpaths"] == ["tests"] and "-ra" in ini["addopts"]
    names = {re.split(r"[(:]", m, maxsplit=1)[0] for m in ini["markers"]}  # "component(name): ..." -> component
    assert names >= {"gpu", "t1", "t2", "component", "feature", "slow"}


def test_pytest_plugin_entry_point_imports():
    eps = importlib.metadata.entry_points(group="pytest11")
    ep = [e for e in eps if e.name == "vgct"]
    assert ep and ep[0].value == "vgct_ext.plugin"
    ep[0].load()


@pytest.mark.slow
def test_cpu_only_build_into_scratch_dir(tmp_path):
    """VGCT_CUDA=0 builds a CPU-only module (into a scratch dir, the tree is not touched)."""
    env = dict(os.environ, VGCT_CUDA="0")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-b", str(tmp_path / "b"),
                        "-t", str(tmp_path / "t")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CPU-only build (VGCT_CUDA=0)" in r.stdout
    so = list((tmp_path / "b" / "vgct_ext").glob("_C*.so"))
    assert len(so) == 1
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("vgct_ext._C", {str(so[0])!r})
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        bi = m.build_info()
        import numpy as np
        d = m.compare(np.arange(4.0), np.zeros(4))
        assert not bi["cuda_compiled"] and bi["cuda_device_count"] == 0, bi
        assert d["max_abs_err"] == 3.0, d
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_paired_stats_surface():
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]], np.float32)
    e = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99), dim=1)
    with pytest.raises(Exception):
        s.n = 3  # frozen
    assert s.p99 == s.quantile(0.99) == s.quantiles[0.99] == float(np.quantile([0, 0, 0, 0, 0, 0.5], 0.99))
    with pytest.raises(KeyError, match="quantile 0.9 was not computed"):
        s.quantile(0.9)
    d = s.as_dict()
    import json

    back = json.loads(json.dumps(d, allow_nan=False))
    assert back["shape"] == [2, 3] and back["max_abs_err_index"] == [1, 2]
    assert back["slices"]["count"] == [2, 2, 2]
    line = s.summary()
    assert "\n" not in line and "float32 vs float64" in line and "rel_l2=" in line
    text = str(s)
    assert text.startswith("PairedStats\n") and "max |a-e|" in text and "(1, 2)" in text
    assert s.slices.worst() == 2
    assert vgct_ext.compare(a, e, dim=1) == vgct_ext.compare(a, e, dim=1)  # deterministic, value equality


def test_slice_worst_rules():
    # slice 0: zero reference with an error -> worst despite slice 1's rel_l2
    a = np.array([[0.1, 1.0], [0.0, 3.0]])
    e = np.array([[0.0, 1.0], [0.0, 1.0]])
    s = vgct_ext.compare(a, e, dim=1)
    assert np.isnan(s.slices.rel_l2[0]) and s.slices.ref_rms[0] == 0.0
    assert s.slices.worst() == 0
    s2 = vgct_ext.compare(np.full((2, 2), np.nan), np.zeros((2, 2)), dim=0)
    assert s2.slices.worst() is None and list(s2.slices.count) == [0, 0]
    assert np.isnan(s2.slices.mean_shift).all() and np.isnan(s2.slices.max_abs_err).all()


def test_layout_core_and_method_with_stable_module_paths():
    """The engine face lives in vgct_ext.core, the method in vgct_ext.method; the documented module paths
    vgct_ext.gates, ... are the very same module objects (a monkeypatch through one is seen through the other),
    every name of __all__ resolves, and neither the package, core nor method imports torch or the method layer
    before it is used."""
    import subprocess
    import sys

    code = (
        "import sys, importlib, vgct_ext, vgct_ext.core, vgct_ext.method\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert not [m for m in sys.modules if m.startswith('vgct_ext.method.')], 'method layer loaded'\n"
        "assert vgct_ext.compare is vgct_ext.core.compare and vgct_ext.PairedStats is vgct_ext.core.PairedStats\n"
        "for old, new in [('gates', 'method.gates'), ('probes', 'method.probes'), ('evidence', 'method.evidence'),\n"
        "                 ('experiment', 'method.experiment'), ('skips', 'method.skips'), ('plugin', 'method.plugin'),\n"
        "                 ('sharded', 'core.sharded')]:\n"
        "    a = importlib.import_module('vgct_ext.' + old)\n"
        "    b = importlib.import_module('vgct_ext.' + new)\n"
        "    assert a is b and getattr(vgct_ext, old) is b and sys.modules['vgct_ext.' + old] is b, old\n"
        "import vgct_ext.gates as g\n"
        "from vgct_ext.gates import _hard_gates\n"
        "assert _hard_gates is vgct_ext.method.gates._hard_gates\n"
        "assert all(hasattr(vgct_ext, n) for n in vgct_ext.__all__)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_core_never_imports_the_method_layer():
    """vgct_ext/core/*.py import nothing from vgct_ext.method (the method builds on the core, not the reverse)."""
    import ast

    core = ROOT / "vgct_ext" / "core"
    files = sorted(core.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "_api.py", "_dlpack.py", "_stats.py", "sharded.py"}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                names = [a.name for a in node.names]
                assert "method" not in mod.split(".") and not (mod == ".." and "method" in names), (f.name, mod)
                assert not (node.level == 0 and (node.module or "").startswith("vgct_ext.method")), f.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("vgct_ext.method") for a in node.names), f.name


def test_every_host_round_trip_of_the_cuda_code_goes_through_callctx_sync():
    """cuda/*.cu and *.cuh wait for the device only through CallCtx::sync or CallCtx::wait_signal (the
    reduction's completion word, whose wait asks cudaStreamQuery and, after a while, leaves the rest to
    cudaStreamSynchronize; cuda/runtime.cu), which count each
    wait for the GPU tests (vgct_cuda_test_syncs: test_gpu.py checks that the fused window's call makes no
    round trip before its reduction, and one in all when the record answers its p99). A direct
    cudaStreamSynchronize, a blocking cudaMemcpy/cudaMemset or a device/event synchronisation elsewhere would
    be a round trip those tests cannot see. (cudaFree on the workspace's failed first allocation is allowed:
    an error path before any kernel.)"""
    blocking = re.compile(r"\b(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy|"
                          r"cudaMemset|cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemcpy2D|cudaStreamQuery)\s*\(")
    files = sorted((ROOT / "cuda").glob("*.cu")) + sorted((ROOT / "cuda").glob("*.cuh"))
    assert {f.name for f in files} >= {"reduce.cu", "select.cu", "runtime.cu", "vgct_cuda_internal.cuh"}
    found = []
    for f in files:
        code = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), f.read_text(), flags=re.S)
        code = re.sub(r"//[^\n]*", "", code)
        code = re.sub(r'"(\\.|[^"\\])*"', '""', code)  # the error messages name the calls
        for i, line in enumerate(code.splitlines(), 1):
            for m in blocking.finditer(line):
                found.append((f.name, i, m.group(1)))
    src = (ROOT / "cuda" / "runtime.cu").read_text().splitlines()

    def body(opener):  # the (first, last) line of the runtime.cu function whose definition opens so
        first = [i for i, line in enumerate(src, 1) if line.startswith(opener)]
        assert len(first) == 1, (opener, first)
        return first[0], next(i for i in range(first[0], len(src) + 1) if src[i - 1] == "}")

    sync, wait = body("cudaError_t CallCtx::sync()"), body("cudaError_t CallCtx::wait_signal(")
    inside = {"sync": [x[2] for x in found if x[0] == "runtime.cu" and sync[0] <= x[1] <= sync[1]],
              "wait_signal": [x[2] for x in found if x[0] == "runtime.cu" and wait[0] <= x[1] <= wait[1]]}
    # sync's own call; wait_signal's query of a failed stream and its fallback to the driver's wait
    assert inside == {"sync": ["cudaStreamSynchronize"],
                      "wait_signal": ["cudaStreamQuery", "cudaStreamSynchronize"]}, (inside, found)
    assert [x for x in found if not (x[0] == "runtime.cu" and (sync[0] <= x[1] <= sync[1] or
                                                               wait[0] <= x[1] <= wait[1]))] == [], found


def test_the_completion_word_is_stored_last_after_a_system_fence():
    """cuda/reduce.cu: vg_signal_done fences at system scope (__threadfence_system) before it stores the
    word, and each of its two calls in vg_reduce_finish (one block; the last block after the fold) comes
    after the same thread's stores of the record (*A.res) and the workspace's reset words (the gate's
    thresholds; the counter after a fold). The host reads the record once it sees the word
    (CallCtx::wait_signal): a missing fence or an early word would hand over a half-written record or
    leave the next kernel a stale counter, which a GPU test catches only when the timing falls so."""
    code = re.sub(r"/\*.*?\*/", " ", (ROOT / "cuda" / "reduce.cu").read_text(), flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)

    def function(head):  # a function's text, from its head to the first line that is "}"
        start = code.index(head)
        return code[start:code.index("\n}", start)]

    signal = function("void vg_signal_done(const RArgs &A)")
    assert 0 < signal.index("__threadfence_system()") < signal.index("= A.seq"), signal
    finish = function("__device__ __forceinline__ void vg_reduce_finish(")
    calls = [m.start() for m in re.finditer(r"vg_signal_done\(A\);", finish)]
    assert len(calls) == 2, finish
    for k, at in enumerate(calls):
        block = finish[finish.rindex("if (threadIdx.x == 0) {", 0, at):at]
        assert "}" not in block, block  # the call is in that block, after everything it stores
        wanted = ["*A.res = sm[0].a;", "A.gate[0] = A.gate[1] = A.gate[2] = 0u;"] + (["*A.counter = 0;"] if k else [])
        assert all(w in block for w in wanted), (k, block)


def _ring_kernel_spills(source: str, tmp_path: Path) -> dict:
    """{k_reduce_bulk instantiation (mangled): (registers, spill store bytes, spill load bytes)} from
    ptxas -v on ``source`` (a cuda/reduce.cu text) compiled for sm_90 as setup.py compiles it."""
    src = tmp_path / "reduce.cu"
    src.write_text(source)
    cmd = [_nvcc(), "-O3", "-std=c++17", "-ftz=false", "-I", str(ROOT / "csrc"), "-I", str(ROOT / "cuda"),
           "-gencode", "arch=compute_90,code=sm_90", "-Xptxas", "-v", "-cubin", "-o", str(tmp_path / "r.cubin"),
           str(src)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0 and "Unsupported gpu architecture" in out.stderr:
        pytest.skip(f"this nvcc ({_nvcc()}) does not target sm_90, the ring kernel's architecture")
    assert out.returncode == 0, out.stderr[-2000:]
    found, cur = {}, None
    for line in out.stderr.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
        if m:
            cur = m.group(1) if "k_reduce_bulk" in m.group(1) else None
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            regs, _, _ = found.get(cur, (None, 0, 0))
            found[cur] = (regs, int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            _, st, ld = found.get(cur, (None, 0, 0))
            found[cur] = (int(m.group(1)), st, ld)
    return found


#: the ring kernel's spills known and measured (bytes stored, loaded): the fused window's every-pair
#: variant (WIN 2) for float16 and bfloat16 pairs, 4 bytes (one store before the loop, one load in the
#: gate's held-maxima merge: docs/performance.md, 2026-12-05 14:10-14:40 UTC); every other variant none
RING_SPILL_KNOWN = {"_Z13k_reduce_bulkILi6ELi6ELi0ELi2ELi0EEv5RArgs": (4, 4),
                    "_Z13k_reduce_bulkILi7ELi7ELi0ELi2ELi0EEv5RArgs": (4, 4)}


@pytest.mark.skipif(_nvcc() is None, reason="no nvcc here: ptxas reports the kernels' registers")
def test_ring_kernels_do_not_spill_more(tmp_path):
    """The ring kernel (cuda/reduce.cu k_reduce_bulk, every instantiation) holds its state in registers
    under __launch_bounds__(256, 2) (at most 128 a thread): a spill puts local-memory traffic in the
    hot loop of every large call (a review of 2026-12-05: four variants sit at 127-128 registers since
    the gate words were deferred). ptxas -v for sm_90, as setup.py compiles it (~40 s): no variant may
    spill more than RING_SPILL_KNOWN says; planted: the same source at three blocks an SM (85
    registers) spills in all 22 (checked 2026-12-05)."""
    found = _ring_kernel_spills((ROOT / "cuda" / "reduce.cu").read_text(), tmp_path)
    assert len(found) >= 20, f"k_reduce_bulk instantiations not found in ptxas -v: {sorted(found)}"
    over = {k: v for k, v in found.items()
            if v[1] > RING_SPILL_KNOWN.get(k, (0, 0))[0] or v[2] > RING_SPILL_KNOWN.get(k, (0, 0))[1]}
    assert not over, f"k_reduce_bulk spills beyond RING_SPILL_KNOWN (registers, store bytes, load bytes): {over}"
    assert all(v[0] is not None and v[0] <= 128 for v in found.values()), found
