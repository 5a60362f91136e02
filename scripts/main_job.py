#!/usr/bin/env python3
"""The main job: run the component parity suite (issue [D]) through pytest and print its evidence.

    python scripts/main_job.py                  # representative subset: every component test not marked slow
    python scripts/main_job.py --full           # also the slow ones (torch.compile on the CPU)
    python scripts/main_job.py --install-deps   # first pip-install the pinned diffusers stack (no torch change)
    python scripts/main_job.py -- -k wan        # extra pytest arguments after --
    python scripts/main_job.py --summarize R.json   # only print the summary of a --vgct-report file

On a CPU machine it runs the CPU cases (L1 oracles, L2 feature-on vs feature-off pairs with T1/T2 gates, the planted
faults, Ulysses context parallel over gloo); where CUDA GPUs are visible the GPU cases run too (they carry the
``gpu`` marker and skip themselves without one). pytest prints the vgct comparison table; ``--vgct-report`` writes
the JSON report; this script then prints a compact evidence summary last (one row per gate and probe, one per
planted fault) and exits with pytest's status.

Needs: vgct_ext built (``pip install --no-build-isolation -e .``), torch, and the pins in ``PINS`` (see
``--install-deps``). Nothing is downloaded at test time: every model is built from an inline config.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join("tests", "unittest", "_torch", "visual_gen")

#: The component-test stack. diffusers is installed without its dependencies (so it can never pull another
#: torch); its pure-Python requirements are listed explicitly; transformers provides the CLIP text encoder.
PINS = {
    "diffusers": "diffusers==0.42.1",
    "transformers": "transformers==5.17.0",
    "huggingface_hub": "huggingface-hub>=1.32,<2",
    "importlib_metadata": "importlib_metadata",
    "PIL": "Pillow",
    "regex": "regex",
    "requests": "requests",
    "filelock": "filelock",
    "safetensors": "safetensors>=0.8.0",
}


def install_deps() -> None:
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    missing = [spec for mod, spec in PINS.items() if mod not in ("diffusers",) and not _importable(mod)]
    if missing:
        print("+ pip install " + " ".join(missing), flush=True)
        subprocess.check_call(pip + missing)
    if not _importable("diffusers") or _version("diffusers") != PINS["diffusers"].split("==")[1]:
        print(f"+ pip install --no-deps {PINS['diffusers']}", flush=True)
        subprocess.check_call(pip + ["--no-deps", PINS["diffusers"]])


def _importable(mod: str) -> bool:
    try:
        importlib.import_module(mod)
        return True
    except Exception:  # noqa: BLE001
        return False


def _version(mod: str) -> str:
    try:
        return importlib.import_module(mod).__version__
    except Exception:  # noqa: BLE001
        return "missing"


def check_env() -> list:
    problems = []
    for mod in ("torch", "vgct_ext", "diffusers", "transformers", "safetensors"):
        if not _importable(mod):
            problems.append(mod)
    return problems


def pytest_command(args, report: str) -> list:
    cmd = [sys.executable, "-m", "pytest", SUITE, f"--ignore={os.path.join(SUITE, 'vgct')}", "-p",
           "no:cacheprovider", "-q", "-rs", f"--vgct-report={report}"]
    if not args.full:
        cmd += ["-m", "not slow"]
    if args.repeat > 1:
        cmd += [f"--vgct-repeat={args.repeat}"]
    return cmd + list(args.pytest_args)


def _fmt(stat: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if stat == "cosine":
        return f"1-{1 - v:.2e}" if v > 0.999999 else f"{v:.6f}"
    return f"{v:.3e}"


def summarize(report_path: str) -> None:
    with open(report_path, encoding="utf-8") as f:
        rep = json.load(f)
    tests = {t["nodeid"]: t for t in rep["tests"]}
    hw = rep["hardware"]
    gpus = ", ".join(g.get("name", "?") if isinstance(g, dict) else str(g) for g in hw.get("gpus") or []) or "none"
    sw = rep["software"]
    print()
    print("=" * 100)
    print("vgct_ext main job: component parity evidence")
    print(f"  command : {rep['command']}")
    print(f"  hardware: CPU {hw.get('cpu', {}).get('model', '?')} ({hw.get('cpu', {}).get('cores', '?')} cores); "
          f"GPUs: {gpus}")
    print(f"  software: torch {sw.get('torch')}, diffusers {sw.get('diffusers')}, transformers "
          f"{sw.get('transformers')}, vgct_ext {sw.get('vgct_ext')}")
    print(f"  tests   : {rep['summary']}")
    groups, fault_groups = {}, {}  # test id -> its comparisons' lines, in report order
    for c in rep["comparisons"]:
        if c.get("repetition"):
            continue
        test = c.get("test") or "-"
        is_fault = "planted_fault" in test or "finding" in test
        where = f"{c['component']} / {c['feature']}"
        if c["kind"] in ("t1", "t2"):
            checks = {k["statistic"]: k for k in c["checks"]}
            gate = c.get("gate", c["kind"].upper()) + (f" ({c['relax']})" if c.get("relax") else "")

            def cell(s, checks=checks):
                k = checks.get(s)
                if k is None:
                    return None
                bar = _fmt(s, k["bar"]) if k["gating"] else "-"
                bad = " FAIL" if k["gating"] and not k["passed"] else ""
                return f"{s} {_fmt(s, k['value'])} ({'<=' if s != 'cosine' else '>='}{bar}){bad}"

            stats = [cell("rel_l2"), cell("cosine")]
            for s_ in ("channel_mean_shift", "channel_rel_l2", "mismatches", "p99"):
                if s_ in checks and checks[s_]["gating"]:
                    k = checks[s_]
                    stats.append(f"{s_}={_fmt(s_, k['value'])}" + ("" if k["passed"] else " FAIL"))
            failed = [k for k in c["checks"] if k["gating"] and not k["passed"]]
            verdict = "pass" if c["passed"] else "FAIL" if failed else "FAIL (evidence)"
            lines = [f"{verdict:8s} {gate}, {c['dtype_actual']}: {where}"]
            line = ""
            for x in (x for x in stats if x):  # the statistics, wrapped at ~100 columns
                if line and len(line) + 2 + len(x) > 86:
                    lines.append(" " * 9 + line)
                    line = ""
                line = f"{line}  {x}" if line else x
            if line:
                lines.append(" " * 9 + line)
        elif c["kind"] == "probe":
            failed = [f["form"] for f in c["forms"] if not f["passed"]]
            verdict = "active" if c["passed"] else "INACTIVE: " + ",".join(failed)
            lines = [f"{verdict:8s} probe ({', '.join(f['form'] for f in c['forms'])}): {where}"]
        else:
            continue
        (fault_groups if is_fault else groups).setdefault(test, []).extend(lines)
    _records(groups)
    if fault_groups:
        print()
        print("Planted faults (each must make its gate or probe FAIL; the test passes when it does):")
        _records(fault_groups)
        print()
        fault_tests = sorted({t for t in tests if "planted_fault" in t or "finding" in t})
        for t in fault_tests:
            o = tests[t]["outcome"]
            word = {"passed": "CAUGHT", "xfailed": "FINDING RECORDED"}.get(o, o.upper())
            print(f"  {word:17s} {t}")
    skips = rep.get("skips") or []
    if skips:
        reasons = {}
        for s in skips:
            reasons.setdefault(s["reason"], 0)
            reasons[s["reason"]] += 1
        print()
        print("Skipped (reason: count):")
        for r, n in sorted(reasons.items()):
            print(f"  {n:3d}  {r}")
    print(f"\nreport: {report_path}")


def _records(groups) -> None:
    """Each test once (its node id, after the file), then one record per comparison it made: the
    verdict, the gate or probe, the dtype and the component / feature on one line, the statistics
    against their bars on the next -- narrow enough to read in a terminal, whatever the ids."""
    for test, lines in groups.items():
        print()
        print("  " + test.split("::", 1)[-1])
        for line in lines:
            print("    " + line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="include tests marked slow")
    ap.add_argument("--install-deps", action="store_true", help="pip-install the pinned component-test stack")
    ap.add_argument("--no-run", action="store_true", help="with --install-deps: only install, run nothing")
    ap.add_argument("--repeat", type=int, default=1, help="--vgct-repeat (run each paired test N times)")
    ap.add_argument("--report", default=os.path.join(ROOT, "build", "main_job_report.json"))
    ap.add_argument("--summarize", metavar="REPORT.json", help="only print the summary of an existing report")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
        return 0
    os.chdir(ROOT)
    if args.install_deps:
        install_deps()
        if args.no_run:
            return 0
    missing = check_env()
    if missing:
        print(f"main job: cannot run, not importable: {', '.join(missing)}. Install with:\n"
              f"  python scripts/main_job.py --install-deps   (pins: {', '.join(PINS.values())})\n"
              f"  and build vgct_ext: pip install --no-build-isolation -e .", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    cmd = pytest_command(args, args.report)
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.call(cmd)
    dt = time.time() - t0
    if os.path.exists(args.report):
        summarize(args.report)
    print(f"main job: pytest exit status {rc} after {dt:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
