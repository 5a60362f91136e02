"""``vgct_ext.skips`` is :mod:`vgct_ext.method.skips` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.skips``,
``from vgct_ext import skips`` and ``from vgct_ext.skips import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import skips as _impl

sys.modules[__name__] = _impl
