"""``vgct_ext.plugin`` is :mod:`vgct_ext.method.plugin` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.plugin``,
``from vgct_ext import plugin`` and ``from vgct_ext.plugin import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import plugin as _impl

sys.modules[__name__] = _impl
