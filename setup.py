"""Build of the vgct_ext._C extension (metadata lives in pyproject.toml).

What is built:
  * csrc/*.c as C11 with warnings on (-Wall -Wextra; -Werror when the
    environment has VGCT_WERROR=1, as CI sets), pthreads, the NumPy headers;
    no OpenMP, so gcc and clang (Apple's too) compile it.
  * when nvcc is found ($CUDA_HOME/bin/nvcc, else `nvcc` on PATH) and
    VGCT_CUDA != "0", and cuda/ holds .cu files (top level only): each one is
    compiled by nvcc (-O3 -std=c++17 -ftz=false -Xcompiler -fPIC -I csrc) for the archs of
    VGCT_CUDA_ARCHS (default "90": sm_90 SASS + compute_90 PTX), the CUDA
    runtime is linked statically (cudart_static -ldl -lrt -lpthread) and the C
    sources get VGCT_HAVE_CUDA=1.  A CUDA compile error fails the build.
  * a generated header vgct_build_config.h (in the build temp dir, on the
    include path of both compilers) records the package version, the nvcc
    version and the -gencode list, for vgct_ext.build_info().

Environment:
  VGCT_CUDA=0            force a CPU-only build
  VGCT_CUDA_ARCHS="80;90" SASS for each listed arch, PTX for the highest
                         (separators: ; , or space; "90a"/"100f" give sm_90a /
                         sm_100f SASS, and PTX always for the plain arch:
                         "90a" -> compute_90)
  VGCT_WERROR=1          add -Werror to the C flags
  VGCT_PHASE_TRACE=1     a diagnostic CUDA build (-DVGCT_PHASE_TRACE): the small-input
                         reduce kernel prints its phases' times on every launch, the
                         ring kernel its warps' loop times (bench/phase_trace.py
                         [--ring]); never for use
  CUDA_HOME / CUDA_PATH  where the toolkit lives (else found from nvcc)
Nothing is downloaded.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("setup.py: no version = \"...\" in pyproject.toml")
    return m.group(1)


def _rel(*parts):
    # setuptools wants paths relative to setup.py for sources
    return os.path.join(*parts)


def _c_sources():
    d = os.path.join(ROOT, "csrc")
    return sorted(_rel("csrc", f) for f in os.listdir(d) if f.endswith(".c"))


def _cu_sources():
    d = os.path.join(ROOT, "cuda")
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.endswith(".cu") and os.path.isfile(os.path.join(d, f)))


def _all_headers():
    """Every header under csrc/ and cuda/ (any depth: kernels may include cuda/<dir>/*.cuh)."""
    out = []
    for sub in ("csrc", "cuda"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, sub)):
            out += [os.path.join(dirpath, f) for f in files if f.endswith((".h", ".cuh", ".inc", ".hpp"))]
    return out


def _find_nvcc():
    """Return (nvcc, cuda_home) or (None, None)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            nvcc = os.path.join(home, "bin", "nvcc")
            if os.path.isfile(nvcc) and os.access(nvcc, os.X_OK):
                return nvcc, home
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None, None
    # nvcc may be a wrapper script (e.g. /usr/local/bin/nvcc -> exec .../cuda/bin/nvcc):
    # look for the toolkit next to the resolved binary, then at the usual place.
    cands = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    try:
        with open(nvcc, "rb") as f:
            head = f.read(4096)
        if head.startswith(b"#!"):
            for m in re.finditer(rb"(/\S+)/bin/nvcc", head):
                cands.append(m.group(1).decode())
    except OSError:
        pass
    cands.append("/usr/local/cuda")
    for home in cands:
        if os.path.isdir(os.path.join(home, "include")) and _cudart_dir(home):
            return nvcc, home
    return nvcc, cands[-1]


def _cudart_dir(home):
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"),
                os.path.join("targets", "sbsa-linux", "lib")):
        d = os.path.join(home, sub)
        if os.path.isfile(os.path.join(d, "libcudart_static.a")):
            return d
    return None


def _nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out) or re.search(r"release ([\d.]+)", out)
    return m.group(1) if m else "unknown"


def _gencode(archs_env):
    """'80;90' -> SASS for 80 and 90, PTX for 90 (the highest).

    An arch-specific ("90a") or family-specific ("100f") entry gets its SASS as given
    (sm_90a), but PTX is only ever emitted for the plain arch (compute_90): "a"/"f" PTX
    runs on no other GPU, so it would defeat the purpose of shipping PTX (JIT on newer GPUs).
    """
    archs = [a for a in re.split(r"[;,\s]+", archs_env.strip()) if a]
    if not archs:
        raise RuntimeError("VGCT_CUDA_ARCHS is empty")
    for a in archs:
        if not re.fullmatch(r"\d+[af]?", a):
            raise RuntimeError(f"VGCT_CUDA_ARCHS: bad arch {a!r} (expected e.g. 90, 90a, 100)")
    flags = []
    for a in dict.fromkeys(archs):  # in order, without duplicates
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    top = max(int(re.match(r"\d+", a).group(0)) for a in archs)
    flags += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    return flags


def _c_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


class VgctBuildExt(build_ext):
    """build_ext that compiles cuda/*.cu with nvcc first (when found) and links
    the objects plus the static CUDA runtime into vgct_ext._C."""

    def build_extension(self, ext):
        gen_dir = os.path.join(os.path.abspath(self.build_temp), "vgct_gen")
        os.makedirs(gen_dir, exist_ok=True)

        cu = _cu_sources()
        nvcc, home = (None, None)
        if os.environ.get("VGCT_CUDA", "1") != "0" and cu:
            nvcc, home = _find_nvcc()
        nvcc_version, gencode = "", []
        if nvcc:
            nvcc_version = _nvcc_version(nvcc)
            gencode = _gencode(os.environ.get("VGCT_CUDA_ARCHS", "90"))
        archs_str = " ".join(gencode)
        # the diagnostic build (-DVGCT_PHASE_TRACE on the kernels): recorded in the config
        # header, so that switching it relinks the module, and reported by build_info()
        trace = int(bool(nvcc) and os.environ.get("VGCT_PHASE_TRACE", "0") not in ("", "0"))

        config = os.path.join(gen_dir, "vgct_build_config.h")
        _write_if_changed(config, (
            "/* generated by setup.py: do not edit */\n"
            "#ifndef VGCT_BUILD_CONFIG_H_\n#define VGCT_BUILD_CONFIG_H_\n"
            f"#define VGCT_VERSION {_c_str(_version())}\n"
            f"#define VGCT_NVCC_VERSION {_c_str(nvcc_version)}\n"
            f"#define VGCT_CUDA_ARCHS {_c_str(archs_str)}\n"
            f"#define VGCT_PHASE_TRACE_BUILD {trace}\n"
            "#endif\n"))
        ext.include_dirs.append(gen_dir)
        # module.c includes it: a new version / nvcc / arch list rebuilds (it is rewritten
        # only when its text changes, so an unchanged configuration stays up to date)
        if config not in ext.depends:
            ext.depends.append(config)

        if nvcc:
            cudart = _cudart_dir(home)
            if cudart is None:
                raise RuntimeError(f"nvcc found ({nvcc}) but no libcudart_static.a under {home}; "
                                   "set CUDA_HOME, or VGCT_CUDA=0 for a CPU-only build")
            objs = self._compile_cuda(nvcc, nvcc_version, home, cu, gencode, gen_dir, trace)
            ext.extra_objects.extend(objs)
            ext.define_macros.append(("VGCT_HAVE_CUDA", "1"))
            ext.library_dirs.append(cudart)
            ext.libraries.extend(["cudart_static", "dl", "rt", "pthread", "stdc++"])
            if sys.platform.startswith("linux"):
                # keep the static runtime's symbols private (torch loads its own cudart)
                ext.extra_link_args.append("-Wl,--exclude-libs,ALL")
            print(f"vgct_ext: CUDA build with {nvcc} ({nvcc_version}), {archs_str}")
        else:
            why = ("VGCT_CUDA=0" if os.environ.get("VGCT_CUDA", "1") == "0"
                   else "no cuda/*.cu" if not cu else "nvcc not found")
            print(f"vgct_ext: CPU-only build ({why})")
        super().build_extension(ext)

    def _compile_cuda(self, nvcc, nvcc_version, home, sources, gencode, gen_dir, trace=0):
        """nvcc each .cu into an object; a CUDA compile error fails the build.

        Objects are cached in build/vgct_cuda_cache/ (pip's editable builds use a fresh temp
        dir each time) under a key hashing the nvcc command, the source, every header under
        csrc/ and cuda/, and the generated config header: an unchanged kernel is not rebuilt.
        """
        import hashlib

        cache = os.path.join(ROOT, "build", "vgct_cuda_cache")
        os.makedirs(cache, exist_ok=True)
        # -ftz=false, stated: the reduce's fast path proves its bounds with IEEE
        # float32 subnormals (cuda/vgct_cuda_internal.cuh, vg_fast_chunk); never fast math
        flags = ["-O3", "-std=c++17", "-ftz=false", "-Xcompiler", "-fPIC,-fvisibility=hidden",
                 "-I", os.path.join(ROOT, "csrc"), "-I", os.path.join(ROOT, "cuda"),
                 "-I", gen_dir, "-I", os.path.join(home, "include"),
                 "-DVGCT_HAVE_CUDA=1"] + gencode
        if self.debug:
            flags += ["-g", "-lineinfo"]
        if trace:
            flags.append("-DVGCT_PHASE_TRACE")  # diagnostics only (cuda/reduce.cu, vg_pt_report)
        common = hashlib.sha256()
        common.update(nvcc.encode() + b"\0" + nvcc_version.encode())
        common.update("\0".join(f for f in flags if f != gen_dir).encode())
        deps = sorted(_all_headers()) + [os.path.join(gen_dir, "vgct_build_config.h")]
        for path in deps:
            common.update(os.path.relpath(path, ROOT).encode() + b"\0")
            with open(path, "rb") as f:
                common.update(f.read())

        def one(src):
            h = common.copy()
            with open(src, "rb") as f:
                h.update(os.path.relpath(src, ROOT).encode() + b"\0" + f.read())
            stem = os.path.splitext(os.path.basename(src))[0]
            obj = os.path.join(cache, f"{stem}-{h.hexdigest()[:20]}.o")
            if self.force or not os.path.exists(obj):
                tmp = f"{obj}.{os.getpid()}.tmp.o"
                cmd = [nvcc, "-c", src, "-o", tmp] + flags
                print(" ".join(cmd), flush=True)
                r = subprocess.run(cmd)
                if r.returncode != 0:
                    if os.path.exists(tmp):
                        os.remove(tmp)
                    raise RuntimeError(f"nvcc failed on {src} (exit {r.returncode})")
                os.replace(tmp, obj)
            else:
                print(f"vgct_ext: {os.path.relpath(src, ROOT)} unchanged, cached {obj}")
            return obj

        jobs = max(1, min(len(sources), self.parallel or os.cpu_count() or 1, 4))
        with ThreadPoolExecutor(jobs) as pool:
            objs = list(pool.map(one, sources))
        keep = set(objs)  # drop stale objects of these sources
        stems = {os.path.splitext(os.path.basename(s))[0] for s in sources}
        for f in os.listdir(cache):
            p = os.path.join(cache, f)
            if p not in keep and f.endswith(".o") and f.rsplit("-", 1)[0] in stems:
                try:
                    os.remove(p)
                except OSError:
                    pass
        return objs


def _extension():
    import numpy

    werror = os.environ.get("VGCT_WERROR", "0") not in ("", "0")
    cflags = ["-std=c11", "-O3", "-Wall", "-Wextra", "-pthread", "-fvisibility=hidden"]
    if werror:
        cflags.append("-Werror")
    return Extension(
        "vgct_ext._C",
        sources=_c_sources(),
        # a changed header, .cu file or pyproject.toml (the version in the generated config
        # header; build_extension adds that header too) rebuilds: build_ext skips an
        # up-to-date .so
        depends=[os.path.relpath(p, ROOT) for p in _all_headers() + _cu_sources()] + ["pyproject.toml"],
        include_dirs=[numpy.get_include(), "csrc"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=cflags,
        extra_link_args=["-pthread"],
        libraries=["m"],
    )


if sysconfig.get_platform().startswith("win"):
    raise RuntimeError("vgct_ext builds on Linux and macOS (POSIX threads)")

setup(ext_modules=[_extension()], cmdclass={"build_ext": VgctBuildExt})
