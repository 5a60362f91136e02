"""Command line: ``python -m vgct_ext compare A.safetensors B.safetensors [--gate t1]``, ``python -m vgct_ext info``
and ``python -m vgct_ext evidence show|annotate|remove FILE ...``.

``compare`` reads two safetensors files (A = actual, B = expected/reference), pairs tensors by name and prints
one row per name: dtypes, shape, relative L2, cosine, max abs error, p99 abs error, elementwise mismatches and
the verdict. With ``--gate t1`` each pair is gated by :func:`vgct_ext.gates.assert_t1` (``--relax`` and bars as
there) and the failure messages follow the table. A name present in only one file, or a shape mismatch, is a
failure, and so is a pair of files with no tensor at all ("no tensors compared"). ``--dim`` must be a valid
axis of every tensor (``-ndim <= dim < ndim``); otherwise it is a usage error naming the tensor and its ndim.
Exit status: 0 all compared (and passed the gate), 1 a failure, 2 a usage error or a refused request
(:class:`vgct_ext.gates.TransparencyFinding`).

``info`` prints the build (``vgct_ext.build_info()``), the hardware (CPU, GPUs, driver, CUDA) and the
versions of the libraries that shape a result. ``--json`` gives either as JSON.

``evidence show FILE [KEY] [--stratum S] [--json]`` prints calibration evidence: per entry and stratum the
experiment, runs (seeds, tests), each bar with every digit (``repr``; a cosine also as ``1 - d``), worst, mean
and spread, the rule and the investigation note. ``evidence annotate FILE KEY --stratum S --investigation
TEXT`` (or ``--clear``) records the note a cosine bar under 0.99 requires; ``evidence remove FILE KEY
[--stratum S]`` removes an entry, and with ``--test TEST_ID`` only that test's runs, re-deriving the bars from
the runs left (a renamed test's old id). Both write under the file's lock, atomically. Exit 2 for an unknown file,
key or stratum (``show --stratum`` too, naming the strata recorded), a malformed file (the message names the
field), or a write that fails (a full disk: the message names the file and says nothing was written).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple


def _load(path: str) -> Dict[str, Any]:
    """``{name: tensor}``: torch tensors when torch is installed (bf16/fp8 need it), else NumPy arrays."""
    from safetensors import safe_open

    try:
        importlib.import_module("torch")  # (imported for safetensors' "pt" framework, not used here)
        framework = "pt"
    except ImportError:
        framework = "numpy"
    with safe_open(path, framework=framework) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def cmd_compare(args: argparse.Namespace) -> int:
    from vgct_ext import compare

    from .method.gates import GateFailure, TransparencyFinding, assert_t1, fmt_value, resolve_t1_bars

    bar_kw = {k: getattr(args, k) for k in ("rel_l2", "cosine", "rtol", "atol") if getattr(args, k) is not None}
    if args.gate == "t1":
        try:
            resolve_t1_bars(args.relax, **bar_kw, component="(command line)", feature="compare")
        except (TransparencyFinding, ValueError, TypeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif args.relax or bar_kw:
        print("error: --relax/--rel-l2/--cosine/--rtol/--atol apply to --gate t1", file=sys.stderr)
        return 2
    for p in (args.a, args.b):
        if not os.path.exists(p):
            print(f"error: {p}: no such file", file=sys.stderr)
            return 2
    try:
        ta, tb = _load(args.a), _load(args.b)
    except Exception as exc:  # noqa: BLE001 - a corrupt/foreign file is a usage error here
        print(f"error: cannot read safetensors: {exc}", file=sys.stderr)
        return 2
    names = sorted(set(ta) | set(tb))
    if not names:
        print(f"error: no tensors compared: {args.a} and {args.b} hold no tensors", file=sys.stderr)
        return 1
    if args.dim is not None:
        for name in names:
            for side, t in (("A", ta.get(name)), ("B", tb.get(name))):
                if t is None:
                    continue
                nd = len(t.shape)
                if not -nd <= args.dim < nd:
                    print(f"error: --dim {args.dim} is out of range for tensor {name!r} in {side} (ndim {nd}, "
                          f"shape {tuple(t.shape)})", file=sys.stderr)
                    return 2
    feature = f"{os.path.basename(args.a)} vs {os.path.basename(args.b)}"
    rows: List[Tuple[str, ...]] = []
    messages: List[str] = []
    records: List[Dict[str, Any]] = []
    failed = False
    for name in names:
        if name not in tb or name not in ta:
            where = "B" if name not in tb else "A"
            t = ta.get(name, tb.get(name))
            rows.append((name, _dtype(t), "x".join(map(str, t.shape)), "", "", "", "", "", f"MISSING in {where}"))
            records.append({"name": name, "verdict": f"missing in {where}"})
            failed = True
            continue
        a, b = ta[name], tb[name]
        if tuple(a.shape) != tuple(b.shape):
            rows.append((name, f"{_dtype(a)}/{_dtype(b)}", f"{tuple(a.shape)} vs {tuple(b.shape)}", "", "", "", "",
                         "", "SHAPE MISMATCH"))
            records.append({"name": name, "verdict": "shape mismatch", "shape_a": list(a.shape),
                            "shape_b": list(b.shape)})
            failed = True
            continue
        verdict = "-"
        dim = args.dim  # validated above for every tensor
        try:
            if args.gate == "t1":
                try:
                    s = assert_t1(a, b, component=name, feature=feature, relax=args.relax, dim=dim, **bar_kw)
                    verdict = "pass"
                except GateFailure as exc:
                    s = exc.stats
                    verdict = "FAIL"
                    failed = True
                    messages.append(str(exc))
            else:
                s = compare(a, b, dim=dim)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            rows.append((name, f"{_dtype(a)}/{_dtype(b)}", "x".join(map(str, a.shape)), "", "", "", "", "",
                         f"ERROR: {exc}"))
            records.append({"name": name, "verdict": "error", "error": str(exc)})
            failed = True
            continue
        rows.append((name, f"{s.dtype_actual}/{s.dtype_expected}", "x".join(map(str, s.shape)) or "()",
                     fmt_value("rel_l2", s.rel_l2), fmt_value("cosine", s.cosine), fmt_value("x", s.max_abs_err),
                     fmt_value("x", s.quantiles.get(0.99)),
                     # the statistics are over finite pairs only: say how many pairs they left out
                     f"{s.mismatches}/{s.n_finite}" + (f" (+{s.n - s.n_finite} non-finite)" if s.n_finite < s.n
                                                        else ""), verdict))
        records.append({"name": name, "verdict": verdict, "stats": s.as_dict()})
    if args.json:
        json.dump({"a": args.a, "b": args.b, "gate": args.gate, "tensors": records}, sys.stdout, indent=2,
                  default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
        print()
    else:
        header = ("tensor", "dtype (A/B)", "shape", "rel_l2", "cosine", "max_abs_err", "p99", "mismatches",
                  "verdict")
        from ._table import render_grouped, terminal_width

        # a terminal: fitted to its width (each tensor over its statistics when the row does not fit); a pipe or
        # file: whole lines
        for line in render_grouped(header, rows, terminal_width(sys.stdout), key=3, heading=_tensor_heading,
                                   priority=(8, 3, 4, 5, 6, 7)):
            print(line)
        for m in messages:
            print()
            print(m)
        n_fail = sum(1 for r in rows if r[-1] not in ("pass", "-"))
        note = "" if args.gate == "t1" else " (no gate: statistics only)"
        print(f"\n{len(rows)} tensor(s), {n_fail} failed{note}")
    return 1 if failed else 0


def _tensor_heading(head: Sequence[str]) -> List[str]:
    """The heading lines of one tensor in the narrow compare table: its name, then ``  dtypes  shape``."""
    name, dtype, shape = head
    return [name, f"  {dtype}  {shape}"]


def cmd_info(args: argparse.Namespace) -> int:
    try:  # a GPU described through torch when it is installed; info must work without it
        importlib.import_module("torch")
    except ImportError:
        pass
    import vgct_ext

    from .method._hardware import hardware_info, versions

    from .method._hardware import stratum_of

    info = {"build": vgct_ext.build_info(), "hardware": hardware_info(), "versions": versions()}
    info["hardware"].pop("vgct_build", None)
    # the strata T2 evidence is keyed on (docs/method.md): what a calibration here records, what a gate reads
    strata = {}
    torch = sys.modules.get("torch")
    try:  # CUDA ordinals (what a tensor's device names), not nvidia-smi's physical indices
        ngpu = int(torch.cuda.device_count()) if torch is not None else 0
    except Exception:  # noqa: BLE001 - no usable CUDA: the CPU stratum only
        ngpu = 0
    for dev in ["cpu"] + [f"cuda:{i}" for i in range(ngpu)]:
        try:
            strata[dev] = stratum_of(dev)
        except (RuntimeError, ValueError) as exc:
            strata[dev] = f"unknown ({exc})"
    info["strata"] = strata
    if args.json:
        json.dump(info, sys.stdout, indent=2, default=str)
        print()
        return 0
    print("vgct_ext build")
    for k, v in info["build"].items():
        print(f"  {k}: {v}")
    hw = info["hardware"]
    print("hardware")
    print(f"  cpu: {hw['cpu']['model']} ({hw['cpu']['machine']}, {hw['cpu']['cores']} cores)")
    print(f"  platform: {hw['platform']}")
    if not hw["gpus"]:
        print("  gpus: none visible")
    for g in hw["gpus"]:
        print(f"  gpu {g.get('index')}: {g.get('name')} {g.get('architecture') or ''} driver {g.get('driver')}")
    if hw.get("torch_cuda"):
        print(f"  torch CUDA: {hw['torch_cuda']}")
    print("evidence strata (T2 bars and T1 floors are recorded and read per stratum)")
    for dev, st in info["strata"].items():
        print(f"  {dev}: {st}")
    print("versions")
    for k, v in info["versions"].items():
        print(f"  {k}: {v}")
    return 0


def cmd_evidence(args: argparse.Namespace) -> int:
    from ._table import terminal_width
    from .method import evidence as ev

    if args.action in ("annotate", "remove") and not os.path.isfile(args.file):
        # before the file lock: a lock file would be left beside a file that does not exist
        print(f"error: {args.file}: no such evidence file", file=sys.stderr)
        return 2
    try:
        if args.action == "show":
            data = ev.load(args.file)
            if not os.path.exists(args.file):
                print(f"error: {args.file}: no such file", file=sys.stderr)
                return 2
            entries = data["entries"]
            keys = [args.key] if args.key is not None else sorted(entries)
            if args.key is not None and args.key not in entries:
                print(f"error: {args.file}: no entry {args.key!r} (entries: "
                      f"{', '.join(repr(k) for k in sorted(entries)) or 'none'})", file=sys.stderr)
                return 2
            if args.stratum is not None:  # an unknown stratum is an error, not an empty listing
                have = sorted({s for k in keys for s in entries[k]})
                if args.stratum not in have:
                    what = f"entry {args.key!r} has no" if args.key is not None else "no entry has"
                    print(f"error: {args.file}: {what} stratum {args.stratum!r} (strata: {', '.join(have) or 'none'})",
                          file=sys.stderr)
                    return 2
                keys = [k for k in keys if args.stratum in entries[k]]
            if args.json:
                json.dump({k: {s: e for s, e in entries[k].items() if args.stratum in (None, s)} for k in keys},
                          sys.stdout, indent=2, sort_keys=True)
                print()
                return 0
            print(f"{args.file} ({data['format']}): {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
            for k in keys:
                for stratum in sorted(entries[k]):
                    if args.stratum is None or stratum == args.stratum:
                        print("\n".join(ev.format_entry(k, stratum, entries[k][stratum], terminal_width(sys.stdout))))
            return 0
        if args.action == "annotate":
            text = None if args.clear else args.investigation
            if text is None and not args.clear:
                print("error: give --investigation \"...\" (or --clear)", file=sys.stderr)
                return 2
            if text is not None and not text.strip():
                print("error: --investigation must say what was found (empty note)", file=sys.stderr)
                return 2
            ev.annotate(args.file, args.key, args.stratum, text)
            print(f"{args.file} [{args.key}] {args.stratum}: investigation "
                  + ("cleared" if text is None else f"set to {text!r}"))
            return 0
        if args.action == "remove" and (args.test is not None or args.test_module is not None):
            if args.test is None:
                print("error: --test-module needs --test", file=sys.stderr)
                return 2
            for c in ev.remove_test(args.file, args.key, args.test, args.stratum, args.test_module):
                what = "floor" if c["kind"] == "t1_floor" else "bars"
                head = f"{args.file} [{args.key}] {c['stratum']}: removed {c['removed']} run(s) of {args.test}; "
                if not c["left"]:
                    print(head + "no run left: stratum removed")
                    continue
                print(head + f"{c['left']} left, {what} re-derived from them")
                for name, old, new in c["bars"]:
                    o, n = ("-" if v is None else ev.fmt_exact(name, v) for v in (old, new))
                    print(f"  {name}: {o} -> {n}" + ("  LOOSER" if name in c["looser"] else ""))
                if c["note_dropped"]:
                    why = ev.NOTE_DROPPED_WHY.get(c["note_dropped"], ev.NOTE_DROPPED_WHY["cosine"])
                    print(f"  the investigation note was dropped: {why}; investigate and annotate it again (evidence "
                          f"annotate ... --stratum {c['stratum']} --investigation \"...\") or the gate refuses it")
                for w in c["warnings"]:
                    print(f"  warning: {w}")
            return 0
        if args.action == "remove":
            gone = ev.remove(args.file, args.key, args.stratum)
            print(f"{args.file} [{args.key}]: removed stratum(s) {', '.join(gone)}")
            return 0
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # the reader closed the pipe: main() ends quietly
    except OSError as exc:
        if args.action in ("annotate", "remove"):  # (a full disk: the errno's words alone name no file)
            where = f"{args.file} [{args.key}]" + (f" {args.stratum}" if args.stratum is not None else "")
            print(f"error: {where}: {exc}. Nothing was written", file=sys.stderr)
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(args.action)


def _parser() -> argparse.ArgumentParser:
    from .method.gates import Relax

    p = argparse.ArgumentParser(prog="python -m vgct_ext", description="vgct_ext: paired statistics and gates")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="compare the tensors of two safetensors files by name")
    c.add_argument("a", help="A.safetensors (actual, e.g. feature on)")
    c.add_argument("b", help="B.safetensors (expected, the reference)")
    c.add_argument("--gate", choices=("none", "t1"), default="none", help="gate each pair (default: statistics only)")
    c.add_argument("--relax", default=None, help="named cause for T1: " + ", ".join(repr(m.value) for m in Relax))
    c.add_argument("--rel-l2", dest="rel_l2", type=float, default=None, help="T1 relative L2 bar")
    c.add_argument("--cosine", type=float, default=None, help="T1 cosine bar")
    c.add_argument("--rtol", type=float, default=None, help="T1 elementwise rtol")
    c.add_argument("--atol", type=float, default=None, help="T1 elementwise atol")
    c.add_argument("--dim", type=int, default=None, help="axis for per-slice statistics (worst slice in messages)")
    c.add_argument("--json", action="store_true", help="print JSON instead of the table")
    c.set_defaults(func=cmd_compare)
    i = sub.add_parser("info", help="build and hardware")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)
    e = sub.add_parser("evidence", help="show or annotate calibration evidence (*.vgct-evidence.json)")
    esub = e.add_subparsers(dest="action", required=True)
    s = esub.add_parser("show", help="print the entries of an evidence file (every digit of every bar)")
    s.add_argument("file")
    s.add_argument("key", nargs="?", default=None, help='an entry key, e.g. "wan.transformer | FirstBlockCache"')
    s.add_argument("--stratum", default=None, help="only this stratum (cpu-avx512, sm_90, ...)")
    s.add_argument("--json", action="store_true", help="print the entries as JSON")
    a = esub.add_parser("annotate", help="record an investigation note in one entry (atomic, under the file lock)")
    a.add_argument("file")
    a.add_argument("key")
    a.add_argument("--stratum", required=True)
    g = a.add_mutually_exclusive_group()
    g.add_argument("--investigation", default=None, help="what the investigation of the drift found")
    g.add_argument("--clear", action="store_true", help="remove the note")
    r = esub.add_parser("remove", help="remove an entry (or one stratum of it), e.g. one listed as unused; with "
                                       "--test, only one test's runs (bars re-derived from the rest)")
    r.add_argument("file")
    r.add_argument("key")
    r.add_argument("--stratum", default=None)
    r.add_argument("--test", default=None, metavar="TEST_ID",
                   help="remove only this test's runs (its id as `evidence show` lists it, e.g. a renamed test's "
                        "old id) and re-derive the bars from the runs left")
    r.add_argument("--test-module", default=None, metavar="MODULE",
                   help="with --test: only the runs recorded from this test module (as `evidence show --json` "
                        "lists it), when two tests of one id share the file")
    e.set_defaults(func=cmd_evidence)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; its exit status.  A reader that closes the pipe early (``... | head``) ends the command
    quietly with status 141 (128 + SIGPIPE, what a shell reports for a process the signal ended), as the
    Python documentation's "Note on SIGPIPE" recommends: no traceback, no error message."""
    args = _parser().parse_args(argv)
    if getattr(args, "gate", None) == "none":
        args.gate = None
    try:
        rc = int(args.func(args))
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's final flush must not raise again
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


if __name__ == "__main__":
    sys.exit(main())
