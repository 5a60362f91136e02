"""``vgct_ext.probes`` is :mod:`vgct_ext.method.probes` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.probes``,
``from vgct_ext import probes`` and ``from vgct_ext.probes import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import probes as _impl

sys.modules[__name__] = _impl
