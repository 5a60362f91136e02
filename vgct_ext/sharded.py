"""``vgct_ext.sharded`` is :mod:`vgct_ext.core.sharded` (a stable import path: this module object is replaced by it).

The engine's Python face lives in ``vgct_ext/core/`` (docs/architecture.md); ``import vgct_ext.sharded``,
``from vgct_ext import sharded`` and ``from vgct_ext.sharded import ...`` give the very same module, so an attribute
set or monkeypatched through either path is seen through the other.
"""

import sys

from .core import sharded as _impl

sys.modules[__name__] = _impl
