"""Type stubs for vgct_ext._C (private; the public API is vgct_ext.compare & co.)."""

from typing import Any, Dict, Optional, Sequence, SupportsIndex

MAX_NDIM: int
MAX_QUANTILES: int
__version__: str

def compare(
    actual: Any,
    expected: Any,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    quantiles: Optional[Sequence[float]] = (0.99,),
    dim: Optional[SupportsIndex] = None,  # any integer (numpy.int64 too), not a bool
    stream: Optional[int] = None,  # None for CPU inputs; CUDA: -1 (no sync), 1, 2 or a cudaStream_t
    dtype_actual: Optional[str] = None,
    dtype_expected: Optional[str] = None,
) -> Dict[str, Any]: ...
def fingerprint(x: Any, stream: Optional[int] = None, dtype: Optional[str] = None) -> int: ...
def build_info() -> Dict[str, Any]: ...
def device_props(device: int) -> Dict[str, Any]: ...
