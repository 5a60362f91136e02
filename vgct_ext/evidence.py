"""``vgct_ext.evidence`` is :mod:`vgct_ext.method.evidence` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.evidence``,
``from vgct_ext import evidence`` and ``from vgct_ext.evidence import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import evidence as _impl

sys.modules[__name__] = _impl
