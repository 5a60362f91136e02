"""Test helpers of vgct_ext (not imported by ``import vgct_ext``).

:mod:`vgct_ext.testing.distributed`: run a function on N local ranks of a
``torch.distributed`` group (free ports, retry on address-in-use) and map shard-local indices
to indices of the gathered tensor, for tests of sharded code such as
:func:`vgct_ext.sharded.compare_sharded`.
"""
