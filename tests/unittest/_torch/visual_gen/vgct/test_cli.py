"""``python -m vgct_ext compare A.safetensors B.safetensors [--gate t1]`` and ``python -m vgct_ext info``."""

from __future__ import annotations

import re

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from vgct_ext.__main__ import main  # noqa: E402


@pytest.fixture
def files(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    y = torch.randn(16, generator=g)
    a = tmp_path / "A.safetensors"
    b = tmp_path / "B.safetensors"
    # float16 against float64 references: the design card's bars (default 1e-3 / 1e-2, outer band 5e-2)
    save_file({"x": (x * (1 + 1e-4)).half(), "y": y.bfloat16(), "z": (x * 1.03).half(), "only_a": y.clone()},
              str(a))
    save_file({"x": x, "y": y, "z": x.clone(), "only_b": y.clone(), "w": y.clone()}, str(b))
    return a, b, x, y


def _rows(out):
    return {line.split()[0]: line for line in out.splitlines() if line and line.split()[0] in
            ("x", "y", "z", "w", "only_a", "only_b")}


def test_compare_without_gate_prints_statistics(files, capsys):
    a, b, x, y = files
    rc = main(["compare", str(a), str(b)])
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rc == 1  # names present in only one file are failures
    xa, xe = (x * (1 + 1e-4)).half().double().numpy(), x.numpy()
    relx = float(np.linalg.norm(xa - xe) / np.linalg.norm(xe))
    assert "float16/float64" in rows["x"] and "4x8" in rows["x"] and f"{relx:.4e}" in rows["x"]
    assert rows["x"].rstrip().endswith("-")
    yb = y.bfloat16().double().numpy()
    rel = float(np.linalg.norm(yb - y.double().numpy()) / np.linalg.norm(y.double().numpy()))
    assert "bfloat16/float32" in rows["y"] and f"{rel:.4e}" in rows["y"]
    assert "MISSING in B" in rows["only_a"] and "MISSING in A" in rows["only_b"]
    assert "MISSING in A" in rows["w"]
    assert "6 tensor(s), 3 failed (no gate: statistics only)" in out


def test_compare_with_t1_gate_gives_verdicts_and_messages(files, capsys):
    a, b, *_ = files
    rc = main(["compare", str(a), str(b), "--gate", "t1"])
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rc == 1
    assert rows["x"].rstrip().endswith("pass")
    assert rows["z"].rstrip().endswith("FAIL") and re.search(r"\b(2\.99|3\.00)\d\de-02", rows["z"])
    assert rows["y"].rstrip().endswith("FAIL")  # bf16 rounding is not within rtol=1e-3
    first = [ln for ln in out.splitlines() if ln.startswith("T1 gate failed") and "component 'z'" in ln]
    assert first and "relative L2" in first[0] and "feature 'A.safetensors vs B.safetensors'" in first[0]
    assert "actual float16 vs expected float64, shape (4, 8)" in out


def test_compare_passes_and_exits_zero(tmp_path, capsys):
    x = torch.linspace(-1, 1, 32)
    save_file({"out": x * (1 + 1e-7)}, str(tmp_path / "on.safetensors"))  # float32 default: rel L2 9.5e-7
    save_file({"out": x}, str(tmp_path / "off.safetensors"))
    assert main(["compare", str(tmp_path / "on.safetensors"), str(tmp_path / "off.safetensors"), "--gate", "t1"]) == 0
    assert "1 tensor(s), 0 failed" in capsys.readouterr().out


def test_compare_relax_and_refused_request(files, capsys):
    a, b, *_ = files
    assert main(["compare", str(a), str(b), "--gate", "t1", "--rel-l2", "0.02"]) == 2
    assert "finding" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--gate", "t1", "--relax", "not a cause"]) == 2
    assert "named accumulation cause" in capsys.readouterr().err
    main(["compare", str(a), str(b), "--gate", "t1", "--relax", "compile fusion"])
    rows = _rows(capsys.readouterr().out)
    assert rows["z"].rstrip().endswith("pass")  # 3e-2 is inside the outer band
    assert main(["compare", str(a), str(b), "--rtol", "1e-2"]) == 2  # bars without a gate


def test_compare_without_gate_shows_the_non_finite_pairs_it_left_out(tmp_path, capsys):
    """One NaN in A: the statistics are over finite pairs, so the row says how many it left out (it showed a
    clean-looking 0/8191 and nothing else)."""
    x = torch.randn(8192, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[5] = float("nan")
    save_file({"t": y}, str(tmp_path / "a.safetensors"))
    save_file({"t": x}, str(tmp_path / "b.safetensors"))
    assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]) == 0
    assert "0/8191 (+1 non-finite)" in capsys.readouterr().out


def test_compare_shape_mismatch_and_json(tmp_path, capsys):
    save_file({"t": torch.zeros(2, 3), "u": torch.ones(4)}, str(tmp_path / "a.safetensors"))
    save_file({"t": torch.zeros(3, 2), "u": torch.ones(4)}, str(tmp_path / "b.safetensors"))
    rc = main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json",
               "--gate", "t1"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    by = {t["name"]: t for t in doc["tensors"]}
    assert by["t"]["verdict"] == "shape mismatch" and by["t"]["shape_b"] == [3, 2]
    assert by["u"]["verdict"] == "pass" and by["u"]["stats"]["rel_l2"] == 0.0 and by["u"]["stats"]["n"] == 4


def test_compare_dim_names_worst_slice(tmp_path, capsys):
    e = torch.ones(3, 5, dtype=torch.float64)
    a = e.clone()
    a[:, 4] += 0.1
    save_file({"t": a}, str(tmp_path / "a.safetensors"))
    save_file({"t": e}, str(tmp_path / "b.safetensors"))
    main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--gate", "t1", "--dim", "1"])
    assert "worst slice along dim 1 (= -1): index 4 of 5" in capsys.readouterr().out


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.safetensors"), str(tmp_path / "nope2.safetensors")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["build"]["version"] and "cuda_compiled" in info["build"]
    assert info["hardware"]["cpu"]["cores"] >= 1 and isinstance(info["hardware"]["gpus"], list)
    assert info["versions"]["torch"] == torch.__version__
    from vgct_ext.method._hardware import stratum_of
    assert info["strata"]["cpu"] == stratum_of("cpu")  # the stratum T2 evidence is keyed on, shown up front


def test_a_reader_closing_the_pipe_ends_quietly(tmp_path):
    """``python -m vgct_ext evidence show FILE --json | head -1``: the reader closes the pipe after one line; the
    command ends with status 141 (128 + SIGPIPE) and prints no error (it printed "[Errno 32] Broken pipe" and
    exited 2)."""
    path = tmp_path / "x.vgct-evidence.json"
    entry = {"kind": "t2", "dtype_actual": "float32", "dtype_expected": "float32", "shape": [4], "dim": None,
             "bars": {"cosine": 0.9999, "rel_l2": 1e-4, "p99": 1e-4, "max_abs_err": 2e-4}, "investigation": None}
    path.write_text(json.dumps({"format": "vgct-evidence/2",
                                "entries": {f"c | f{i}": {"sm_90": entry} for i in range(20000)}}))
    p = subprocess.Popen([sys.executable, "-m", "vgct_ext", "evidence", "show", str(path), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"{"
    p.stdout.close()  # the reader is done
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and "Broken pipe" not in err and "Traceback" not in err, err


def test_module_entry_point_subprocess(files):
    a, b, *_ = files
    r = subprocess.run([sys.executable, "-m", "vgct_ext", "compare", str(a), str(b), "--gate", "t1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "T1 gate failed" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vgct_ext", "info"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "vgct_ext build" in r.stdout and "cpu:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vgct_ext"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "usage" in r.stderr


def test_compare_files_without_tensors_fail(tmp_path, capsys):
    save_file({}, str(tmp_path / "a.safetensors"))
    save_file({}, str(tmp_path / "b.safetensors"))
    for gate in ([], ["--gate", "t1"]):
        assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), *gate]) == 1
        assert "no tensors compared" in capsys.readouterr().err


def test_compare_dim_out_of_range_is_a_usage_error(tmp_path, capsys):
    save_file({"m": torch.ones(3, 5), "v": torch.ones(4)}, str(tmp_path / "a.safetensors"))
    save_file({"m": torch.ones(3, 5), "v": torch.ones(4)}, str(tmp_path / "b.safetensors"))
    args = ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--gate", "t1"]
    assert main(args + ["--dim", "1"]) == 2
    err = capsys.readouterr().err
    assert "--dim 1 is out of range for tensor 'v'" in err and "ndim 1" in err
    assert main(args + ["--dim", "-1"]) == 0  # fits every tensor
    capsys.readouterr()


def test_compare_table_fits_a_narrow_terminal_without_cutting_numbers(files, capsys, monkeypatch):
    from vgct_ext import _table

    a, b, x, y = files
    assert main(["compare", str(a), str(b)]) == 1
    wide = capsys.readouterr().out  # not a terminal: whole lines
    row = _rows(wide)["x"].split()
    monkeypatch.setattr(_table, "terminal_width", lambda stream=None: 60)
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(ln) for ln in wide.splitlines()) > 60 and all(len(ln) <= 60 for ln in lines), lines
    # tensor x: its name, then its dtypes and shape, then its statistics, every number whole
    i = lines.index("x")
    assert lines[i + 1].split() == row[1:3]
    sub = [ln.split() for ln in lines if ln.split()[:1] == ["rel_l2"]]
    assert len(sub) == 1  # the statistics' header, once
    shown = lines[i + 2].split()
    assert len(shown) == len(sub[0]) >= 2 and set(shown) <= set(row[3:]) and shown[0] == row[3]  # rel_l2 whole
    left_out = [h for h in ("rel_l2", "cosine", "max_abs_err", "p99", "mismatches", "verdict") if h not in sub[0]]
    assert left_out and lines[-3] == f"(not shown at this width: {', '.join(left_out)})", lines[-3:]
