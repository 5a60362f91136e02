"""Type stubs for vgct_ext._C (private; the public API is vgct_ext.compare & co.)."""

from typing import Any, Dict, List, Optional, Sequence, SupportsIndex, Tuple

import numpy as np

MAX_NDIM: int
MAX_QUANTILES: int
ACC_VERSION: int

class InputChangedError(RuntimeError):
    """An input was written while compare() read it (docs/metrics.md, "Interrupts, and inputs
    that change during a compare")."""
ACC_SIZE: int
SLICE_ACC_SIZE: int
HIST_MAX_PREFIXES: int
HIST_MAX_WIDTH: int
__version__: str
# compare's stream that leaves it to the inputs' producer (their DLPack C exchange API): compare
# then returns NotImplemented, having done nothing, when an input cannot be taken that way
PRODUCER_STREAM: object

def compare(
    actual: Any,
    expected: Any,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    quantiles: Optional[Sequence[float]] = (0.99,),
    dim: Optional[SupportsIndex] = None,  # any integer (numpy.int64 too), not a bool
    stream: Optional[object] = None,  # None for CPU inputs; CUDA: -1 (no sync), 1, 2 or a
                                      # cudaStream_t; or PRODUCER_STREAM
    dtype_actual: Optional[str] = None,
    dtype_expected: Optional[str] = None,
) -> Any: ...  # Dict[str, Any]; NotImplemented only with PRODUCER_STREAM
def fingerprint(x: Any, stream: Optional[int] = None, dtype: Optional[str] = None) -> int: ...
def build_info() -> Dict[str, Any]: ...
def device_props(device: int) -> Dict[str, Any]: ...

# The steps of compare() for vgct_ext.compare_sharded ([E]; csrc/module.c "sharded comparisons").
def reduce_raw(
    actual: Any,
    expected: Any,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    dim: Optional[int] = None,
    stream: Optional[int] = None,
    dtype_actual: Optional[str] = None,
    dtype_expected: Optional[str] = None,
) -> Dict[str, Any]: ...
def histogram(
    actual: Any,
    expected: Any,
    prefixes: Sequence[int],
    prefix_bits: int,
    width: int,
    stream: Optional[int] = None,
    dtype_actual: Optional[str] = None,
    dtype_expected: Optional[str] = None,
) -> np.ndarray: ...
def merge_raw(records: Sequence[bytes]) -> bytes: ...
def merge_slices_raw(records: Sequence[bytes], concat: bool) -> bytes: ...
def remap_raw(
    acc: bytes, local_shape: Sequence[int], global_shape: Sequence[int], shard_dim: int, offset: int
) -> bytes: ...
def acc_fields(acc: bytes) -> Dict[str, Any]: ...
def quantile_ranks(n: int, quantiles: Sequence[float]) -> List[Tuple[int, int]]: ...
def rank_key_known(acc: bytes, rank: int) -> Optional[int]: ...
def finalize_raw(
    acc: bytes,
    slices: Optional[bytes],
    shape: Sequence[int],
    dtype_actual: str,
    dtype_expected: str,
    device_type: int,
    device_id: int,
    rtol: float,
    atol: float,
    quantiles: Optional[Sequence[float]],
    order_keys: Optional[Sequence[int]],
    dim: Optional[int],
) -> Dict[str, Any]: ...
