"""A/B of two (or more) builds of vgct_ext on the GPU by data shape: the device time of
``compare(a, e, quantiles=None)`` (rows ending in "p99": ``quantiles=(0.99,)``) on pairs of
2^22..2^28 elements, ``e ~ N(0, 1)``: bf16 "ties" (bf16(e + 1e-3 N) against bf16(e): |d| takes a few
values, as bf16 rounding noise does), bf16 "noise" (1e-2), bf16 "identical", fp32 "noise" (1e-3); and
bf16 noise read as bench_gpu.py's transposed matrix (2^14 x 2^14 ``.t()``) and its latent with ``dim=1``
((2, 16, 256, 128, 256): the ring kernel over rows).
Each build runs in its own child process (the extension is imported once a process), the builds
alternated round by round (reversed order in odd rounds), so clock drift does not favour one.
Times: medians of 15 CUDA-event intervals around one call (compare returns after its own
synchronisation); the table prints each round's median and the ratio of the medians to the first.

    AB_ROWS="2^28 bf16 ties,2^28 fp32 noise" python bench/bench_tree_ab.py base=/tmp/base,new=$PWD [ROUNDS]

(each ``tag=path`` a source tree built in place; AB_ROWS picks rows by name, default all fourteen).
"""
import json, os, statistics, subprocess, sys
ROWS = [(26, "bf16 ties"), (26, "bf16 noise"), (26, "bf16 identical"), (26, "fp32 noise"),
        (28, "bf16 ties"), (28, "bf16 noise"), (28, "bf16 identical"), (28, "fp32 noise"),
        (28, "bf16 ties p99"), (28, "bf16 noise p99"), (22, "bf16 ties"), (24, "bf16 ties"),
        (28, "bf16 noise transposed"), (28, "bf16 noise latent dim=1")]
if os.environ.get("AB_ROWS"):
    ROWS = [r for r in ROWS if f"2^{r[0]} {r[1]}" in os.environ["AB_ROWS"].split(",")]

def child(reps):
    import torch, vgct_ext
    out = {}
    cache = {}
    for lg, name in ROWS:
        n = 1 << lg
        if lg not in cache:
            cache.clear(); torch.cuda.empty_cache()
            g = torch.Generator(device="cuda").manual_seed(5)
            e32 = torch.randn(n, device="cuda", generator=g); z = torch.randn(n, device="cuda", generator=g)
            cache[lg] = (e32, z)
        e32, z = cache[lg]
        if name.startswith("fp32"):
            a, e = e32 + 1e-3 * z, e32
        else:
            e = e32.to(torch.bfloat16)
            a = {"ties": (e32 + 1e-3 * z).to(torch.bfloat16), "noise": (e32 + 1e-2 * z).to(torch.bfloat16),
                 "identical": e.clone()}[name.split()[1]]
        dim = None
        if name.endswith("transposed"):  # bench_gpu.py's: a square matrix read through .t()
            side = 1 << (lg // 2)
            a, e = a.view(side, -1).t(), e.view(side, -1).t()
        elif name.endswith("latent dim=1"):  # bench_gpu.py's latent, per-channel statistics
            shape = (2, 16, 256, 128, 256) if lg == 28 else (2, 16, 1 << (lg - 13), 16, 16)
            a, e, dim = a.view(shape), e.view(shape), 1
        q = (0.99,) if name.endswith("p99") else None
        for _ in range(3):
            vgct_ext.compare(a, e, quantiles=q, dim=dim)
        torch.cuda.synchronize()
        ev = []
        for _ in range(reps):
            s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); vgct_ext.compare(a, e, quantiles=q, dim=dim); t.record(); t.synchronize()
            ev.append(s.elapsed_time(t) * 1e3)
        out[f"2^{lg} {name}"] = statistics.median(ev)
        del a, e
    print("JSON" + json.dumps(out))

def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "child":
        child(int(sys.argv[2])); return
    trees = sys.argv[1].split(",")  # tag=path
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    res = {t.split("=")[0]: [] for t in trees}
    for r in range(rounds):
        for t in (trees if r % 2 == 0 else trees[::-1]):
            tag, path = t.split("=")
            env = dict(os.environ, PYTHONPATH=path)
            p = subprocess.run([sys.executable, __file__, "child", "15"], env=env, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
            if not line:
                print(tag, p.stdout[-500:], p.stderr[-2000:]); return
            res[tag].append(json.loads(line[0][4:]))
    tags = list(res)
    print("| row (events us, median of 15; rounds) | " + " | ".join(tags) + " | " + " | ".join(f"{t}/{tags[0]}" for t in tags[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(tags) - 1))
    for k in res[tags[0]][0]:
        vals = [[d[k] for d in res[t]] for t in tags]
        meds = [statistics.median(v) for v in vals]
        print(f"| {k} | " + " | ".join(" / ".join(f"{x:.1f}" for x in v) for v in vals) + " | " +
              " | ".join(f"{m / meds[0]:.3f}" for m in meds[1:]) + " |")
main()
