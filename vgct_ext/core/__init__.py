"""The engine's Python face: everything between a tensor and a :class:`PairedStats`.

* ``_dlpack``  -- DLPack hand-off: picks the consumer stream, keeps the inputs alive, calls ``vgct_ext._C``;
* ``_api``     -- :func:`compare`, :func:`fingerprint`, :func:`build_info` (argument checks, then ``_C``);
* ``_stats``   -- :class:`PairedStats` / :class:`SliceStats`, the frozen results (every number defined once in
  ``csrc/vgct_stats.h``);
* ``sharded``  -- :func:`compare_sharded` over ``torch.distributed`` (docs/sharded.md; torch imported on first call).

Nothing here imports the method layer (:mod:`vgct_ext.method`) or torch. The public names are
``vgct_ext.<name>``; docs/architecture.md draws the whole house.
"""

from ._api import build_info, compare, fingerprint
from ._stats import PairedStats, SliceStats

__all__ = ["compare", "fingerprint", "build_info", "PairedStats", "SliceStats"]
