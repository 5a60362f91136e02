"""The lean kernel's record, every field, on 650 inputs, written to a JSON file: run it once under
each of two builds (``PYTHONPATH`` pointing at each) and diff the files to show that a change to
``k_reduce_lean`` (cuda/reduce.cu) leaves every result bit for bit as it was.  Not a test: the GPU
tests check each result against the CPU engine and the float64 oracle; this compares two builds.

Inputs: bf16, fp16 and fp32 pairs and bf16/fp16 against fp32; 1000, 4101, 2^16 and 2^20 + 5 pairs;
contiguous, offset (x[1:]), strided (x[::3]) and, where the size allows, transposed views; data
with noise, exact ties, zero references, NaN and inf, small integers; rtol = atol = 1e-3 and 0.
The lean kernel is forced for every size (the ``vgct_cuda_test_lean_max`` hook).

    PYTHONPATH=<build A> python bench/lean_bits.py /tmp/a.json
    PYTHONPATH=<build B> python bench/lean_bits.py /tmp/b.json
    python bench/lean_bits.py --diff /tmp/a.json /tmp/b.json
"""
import ctypes
import json
import sys


def records(path):
    import torch

    import vgct_ext
    from vgct_ext import _C

    hook = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_lean_max")
    hook.value = 1 << 62
    g = torch.Generator(device="cuda").manual_seed(5)

    def data(n, kind):
        e = torch.randn(n, device="cuda", generator=g, dtype=torch.float64)
        noise = lambda s: s * torch.randn(n, device="cuda", generator=g, dtype=torch.float64)  # noqa: E731
        if kind == "noise":
            a = e + noise(1e-3)
        elif kind == "ties":
            a = e.clone()
            a[::7] += 1e-2
        elif kind == "zeros":
            e[::3] = 0
            a = e + noise(1e-2)
        elif kind == "nonfinite":
            a = e + noise(1e-2)
            a[5::1001] = float("nan")
            e[17::999] = float("inf")
        else:
            a = torch.randint(-3, 4, (n,), device="cuda", generator=g).double()
            e = torch.randint(-3, 4, (n,), device="cuda", generator=g).double()
        return a, e

    out = {}
    try:
        for dta, dte in (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
                         ("bfloat16", "float32"), ("float16", "float32")):
            for n in (1000, 4101, 1 << 16, (1 << 20) + 5):
                for kind in ("noise", "ties", "zeros", "nonfinite", "ints"):
                    a64, e64 = data(n, kind)
                    a, e = a64.to(getattr(torch, dta)), e64.to(getattr(torch, dte))
                    views = {"contig": (a, e), "offset": (a[1:], e[1:]), "strided": (a[::3], e[::3])}
                    if n % 1000 == 0:
                        views["transposed"] = (a.view(40, -1).t(), e.view(40, -1).t())
                    for vn, (x, y) in views.items():
                        for rt, at in ((1e-3, 1e-3), (0.0, 0.0)):
                            s = vgct_ext.compare(x, y, rtol=rt, atol=at, quantiles=None)
                            out[f"{dta}/{dte}/{n}/{kind}/{vn}/{rt}"] = {
                                k: (v.hex() if isinstance(v, float) else repr(v)) for k, v in s.as_dict().items()}
    finally:
        hook.value = -1
    with open(path, "w") as f:
        json.dump(out, f, sort_keys=True)
    print("cases", len(out))


def diff(pa, pb):
    with open(pa) as f:
        a = json.load(f)
    with open(pb) as f:
        b = json.load(f)
    bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"cases {len(a)} / {len(b)}, differ {len(bad)}")
    for k in bad[:5]:
        print(" ", k, {f: (a.get(k, {}).get(f), b.get(k, {}).get(f)) for f in (a.get(k) or b.get(k))
                       if a.get(k, {}).get(f) != b.get(k, {}).get(f)})
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    records(sys.argv[1])
