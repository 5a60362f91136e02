"""Hardware, stratum and software versions: what a report and a failure message must name.

Private. The CPU's model and instruction set come from py-cpuinfo. Never imports torch: it uses torch only when the caller already imported it
(``sys.modules``), else the core's ``build_info()`` / ``_C.device_props`` and ``nvidia-smi``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import warnings
from typing import Any, Dict, List, Optional

__all__ = ["stratum_of", "describe_device", "cpu_facts", "hardware_info", "versions", "precision_settings",
           "LEGACY_CPU_STRATUM"]


def _cuda_index(device: str) -> Optional[int]:
    if not device.startswith("cuda"):
        return None
    _, _, idx = device.partition(":")
    return int(idx) if idx.isdigit() else 0


@functools.lru_cache(maxsize=None)
def _cuda_props(index: int) -> Dict[str, Any]:
    """``{"name", "major", "minor"}`` of CUDA device ``index`` (empty dict when unknown)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            p = torch.cuda.get_device_properties(index)
            return {"name": p.name, "major": int(p.major), "minor": int(p.minor)}
        except Exception:  # noqa: BLE001 - no CUDA in this torch build / no such device
            pass
    try:
        from vgct_ext import _C  # type: ignore[attr-defined]

        props = getattr(_C, "device_props", None)
        if props is not None:
            d = dict(props(index))
            return {"name": d.get("name"), "major": int(d["major"]), "minor": int(d["minor"])}
    except Exception:  # noqa: BLE001
        pass
    return {}


#: The CPU stratum of evidence written before the stratum named the instruction set; the T2 gate refuses it.
LEGACY_CPU_STRATUM = "cpu"

# x86-64 instruction-set levels in the order csrc/cpu_engine.c dispatches on them (cpu_level: AVX-512 needs
# avx512f+dq+vl+bw, else AVX2, else the SSE2 baseline); torch's ATen CPU capability names the same levels.
_X86_LEVELS = ("sse2", "avx2", "avx512")
_AVX512 = ("avx512f", "avx512dq", "avx512vl", "avx512bw")
_TORCH_CAPABILITY = {"DEFAULT": "sse2", "NO AVX": "sse2", "AVX2": "avx2", "AVX512": "avx512"}


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> Dict[str, Any]:
    try:
        import cpuinfo  # py-cpuinfo

        return dict(cpuinfo.get_cpu_info() or {})
    except Exception:  # noqa: BLE001 - py-cpuinfo missing or failing: the ISA is then unknown (said by the caller)
        return {}


def cpu_facts() -> Dict[str, Any]:
    """The CPU as py-cpuinfo reports it: ``{"model", "arch", "isa"}``.

    ``isa`` is the instruction set that decides which kernels run: on x86-64 ``"avx512"`` (AVX-512 F, DQ, VL
    and BW all present), ``"avx2"`` or ``"sse2"`` -- the levels csrc/cpu_engine.c dispatches on, and torch's
    ATen CPU capabilities; on 64-bit ARM ``"sve"`` or ``"neon"``; elsewhere the machine name. When torch is
    already imported and its CPU capability is a lower x86 level (``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512
    machine) that lower level is used: it is what torch's kernels run. ``isa`` is ``None`` when py-cpuinfo
    reports no flags on x86. py-cpuinfo is asked once per process (it takes about a second).
    """
    info = _cpuinfo()
    flags = {str(f).lower() for f in (info.get("flags") or ())}
    arch = str(info.get("arch") or platform.machine()).upper()
    machine = platform.machine().lower()
    isa: Optional[str]
    if arch in ("X86_64", "X86_32") or machine in ("x86_64", "amd64", "i386", "i686"):
        if not flags:
            isa = None
        elif all(f in flags for f in _AVX512):
            isa = "avx512"
        elif "avx2" in flags:
            isa = "avx2"
        else:
            isa = "sse2"
        torch = sys.modules.get("torch")
        if isa is not None and torch is not None:
            try:
                cap = _TORCH_CAPABILITY.get(str(torch.backends.cpu.get_cpu_capability()).upper())
            except Exception:  # noqa: BLE001 - a torch without get_cpu_capability
                cap = None
            if cap is not None and _X86_LEVELS.index(cap) < _X86_LEVELS.index(isa):
                isa = cap
    elif arch.startswith("ARM_8") or machine in ("aarch64", "arm64"):
        isa = "sve" if "sve" in flags else "neon"
    else:
        isa = machine or arch.lower() or None
    model = info.get("brand_raw") or platform.processor() or platform.machine()
    return {"model": str(model), "arch": arch, "isa": isa}


def _cpu_model() -> str:
    return cpu_facts()["model"]


def stratum_of(device: str) -> str:
    """The hardware stratum a T2 bar belongs to: ``"cpu-<isa>"`` (``cpu-avx512``, ``cpu-avx2``, ``cpu-sse2``,
    ``cpu-neon``, ``cpu-sve``; see :func:`cpu_facts`) for CPU tensors, ``"sm_<major><minor>"`` for a CUDA device.

    ``device`` is a ``PairedStats.device`` string (``"cpu"`` or ``"cuda:K"``). Raises ``RuntimeError`` when
    the architecture of a CUDA device or the instruction set of the CPU cannot be determined (a bar must never
    be applied to an unknown stratum).
    """
    idx = _cuda_index(device)
    if idx is None:
        if device == "cpu":
            isa = cpu_facts()["isa"]
            if isa is None:
                raise RuntimeError("cannot determine the CPU instruction set: py-cpuinfo reported no CPU flags "
                                   "(is py-cpuinfo installed? pip install py-cpuinfo)")
            return f"cpu-{isa}"
        raise RuntimeError(f"no hardware stratum is defined for device {device!r}")
    p = _cuda_props(idx)
    if not p:
        raise RuntimeError(f"cannot determine the GPU architecture of {device}: neither torch.cuda nor "
                           "vgct_ext._C.device_props answered")
    return f"sm_{p['major']}{p['minor']}"


def describe_device(device: str) -> str:
    """``"cpu (x86_64, avx512, <model>)"`` or ``"cuda:0 (sm_90, NVIDIA H200)"`` for failure messages."""
    idx = _cuda_index(device)
    if idx is None:
        f = cpu_facts()
        return f"{device} ({platform.machine()}, {f['isa'] or 'ISA unknown'}, {f['model']})"
    p = _cuda_props(idx)
    if not p:
        return f"{device} (architecture unknown)"
    return f"{device} (sm_{p['major']}{p['minor']}, {p['name']})"


def described_in_stratum(description: str, stratum: str) -> bool:
    """Whether a :func:`describe_device` string (an evidence entry's ``device``) names a device of ``stratum``:
    a CUDA device is never of a CPU stratum nor a CPU of a GPU one, and a description in
    :func:`describe_device`'s format (``"cpu (x86_64, avx512, <model>)"``, ``"cuda:0 (sm_90, NVIDIA H200)"``)
    must name the stratum's instruction set or architecture.  An empty or free-form description (older entries) is not
    refused."""
    dev = str(description or "")
    token = stratum.split("-", 1)[1] if stratum.startswith("cpu-") else stratum  # "avx512", "sm_90"
    if (stratum.startswith("sm_") and dev.startswith("cpu")) or (stratum.startswith("cpu") and dev.startswith("cuda")):
        return False
    return not (dev.startswith(("cpu (", "cuda")) and "(" in dev and token != "cpu" and token not in dev)


def _nvidia_smi() -> List[Dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,compute_cap,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            gpus.append({"index": parts[0], "name": parts[1], "compute_cap": parts[2],
                         "driver": parts[3], "memory": parts[4]})
    return gpus


def hardware_info() -> Dict[str, Any]:
    """The machine: CPU (model, cores), GPUs (name, architecture, driver), CUDA runtime versions."""
    info: Dict[str, Any] = {
        "cpu": {"model": _cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(),
                "isa": cpu_facts()["isa"]},
        "platform": platform.platform(),
        "gpus": [],
    }
    smi = _nvidia_smi()
    for g in smi:
        cc = g["compute_cap"].replace(".", "")
        info["gpus"].append({"index": int(g["index"]) if g["index"].isdigit() else g["index"],
                             "name": g["name"], "architecture": f"sm_{cc}" if cc.isdigit() else None,
                             "driver": g["driver"], "memory": g["memory"]})
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_cuda"] = getattr(torch.version, "cuda", None)
        try:
            if not info["gpus"] and torch.cuda.is_available():
                for i in range(torch.cuda.device_count()):
                    p = _cuda_props(i)
                    info["gpus"].append({"index": i, "name": p.get("name"),
                                         "architecture": f"sm_{p['major']}{p['minor']}" if p else None,
                                         "driver": None})
        except Exception:  # noqa: BLE001
            pass
    try:
        import vgct_ext

        bi = vgct_ext.build_info()
        info["vgct_build"] = {k: v for k, v in dict(bi).items()}
    except Exception as exc:  # noqa: BLE001 - the report must still be written
        info["vgct_build"] = {"error": repr(exc)}
    return info


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(extra: tuple = ()) -> Dict[str, Optional[str]]:
    """Versions of the producer libraries that shape a result (missing ones are omitted)."""
    names = ("vgct_ext", "numpy", "torch", "diffusers", "transformers", "safetensors", "accelerate") + tuple(extra)
    out: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for n in names:
        v = _dist_version(n)
        if v is not None:
            out[n] = v
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        if getattr(torch.version, "cuda", None):
            out["torch_cuda"] = torch.version.cuda
    return out


def precision_settings() -> Dict[str, Any]:
    """torch's global precision switches (TF32, matmul precision, determinism), when torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out: Dict[str, Any] = {}
    with warnings.catch_warnings():  # some of these switches are deprecated in newer torch releases
        warnings.simplefilter("ignore")
        _read_precision(torch, out)
    return out


def _read_precision(torch: Any, out: Dict[str, Any]) -> None:
    try:
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        out["cuda_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        out["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        out["deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
    except Exception:  # noqa: BLE001
        pass
