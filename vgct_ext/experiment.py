"""``vgct_ext.experiment`` is :mod:`vgct_ext.method.experiment` (a stable import path: this module object is replaced by it).

The method layer lives in ``vgct_ext/method/`` (docs/architecture.md); ``import vgct_ext.experiment``,
``from vgct_ext import experiment`` and ``from vgct_ext.experiment import ...`` give the very same module, so an attribute set or
monkeypatched through either path is seen through the other.
"""

import sys

from .method import experiment as _impl

sys.modules[__name__] = _impl
