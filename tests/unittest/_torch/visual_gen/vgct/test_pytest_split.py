"""scripts/pytest_split.sh: one pytest selection run as several processes at once (the GPU
suite's step in scripts/gpu_check.sh). Checked on a scratch test directory: every collected id
runs exactly once across the processes, the sums equal one process's run, a failing test makes
the status non-zero and is named, an empty selection and a bad JOBS are refused."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[5] / "scripts" / "pytest_split.sh"

TESTS = textwrap.dedent("""
    import os
    import pytest

    @pytest.mark.parametrize("i", range(11))
    def test_param(i):
        with open(os.environ["SPLIT_RAN"], "a") as fh:  # one line per test run, any process
            fh.write(f"test_param[{i}] {os.getpid()}\\n")
        assert i != int(os.environ.get("SPLIT_FAIL", "-1"))

    def test_skipped():
        pytest.skip("a reason")

    @pytest.mark.xfail(strict=True)
    def test_xfailed():
        assert 0
""")


def _run(tmp_path, *args, fail=-1):
    (tmp_path / "t").mkdir(exist_ok=True)
    (tmp_path / "t" / "test_scratch.py").write_text(TESTS)
    ran = tmp_path / "ran.txt"
    ran.write_text("")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "SPLIT_RAN": str(ran),
           "SPLIT_FAIL": str(fail), "SPLIT_DIR": str(tmp_path / "logs"), "TMPDIR": str(tmp_path)}
    p = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    return p, ran.read_text().splitlines()


def _sums(out):
    m = re.search(r"pytest_split: (\d+) passed, (\d+) failed, (\d+) skipped, (\d+) xfailed, "
                  r"(\d+) errors of (\d+) ids in (\d+) processes", out)
    assert m, out
    return tuple(int(x) for x in m.groups())


@pytest.mark.parametrize("jobs", [1, 3, 40])
def test_every_id_runs_once_and_the_sums_add_up(tmp_path, jobs):
    p, ran = _run(tmp_path, str(jobs), "-q", "t")
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(r.split()[0] for r in ran) == sorted(f"test_param[{i}]" for i in range(11))
    assert _sums(p.stdout) == (11, 0, 1, 1, 0, 13, min(jobs, 13))
    if jobs == 3:
        assert len({r.split()[1] for r in ran}) == 3  # three processes ran test_param


def test_a_failing_test_fails_the_run_and_is_named(tmp_path):
    p, _ = _run(tmp_path, "4", "-q", "t", fail=7)
    assert p.returncode == 1, p.stdout
    assert "FAILED t/test_scratch.py::test_param[7]" in p.stdout
    assert _sums(p.stdout)[:2] == (10, 1)


def test_selection_options_pass_through(tmp_path):
    p, ran = _run(tmp_path, "2", "-q", "-k", "param and not 3", "t")
    assert p.returncode == 0, p.stdout
    assert len(ran) == 10 and not any("[3]" in r for r in ran)


def test_nothing_collected_and_bad_jobs_are_refused(tmp_path):
    p, _ = _run(tmp_path, "2", "-q", "-k", "no_such_test", "t")
    assert p.returncode == 5 and "no tests collected" in p.stdout
    p, _ = _run(tmp_path, "0", "-q", "t")
    assert p.returncode == 2 and "JOBS: a positive integer" in p.stderr
    p, _ = _run(tmp_path, "2", "-q", "t/no_such_file.py")
    assert p.returncode not in (0, 5) and "collection failed" in p.stdout
