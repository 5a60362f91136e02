"""``vgct_ext.gates`` is :mod:`vgct_ext.method.gates` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.gates``,
``from vgct_ext import gates`` and ``from vgct_ext.gates import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import gates as _impl

sys.modules[__name__] = _impl
