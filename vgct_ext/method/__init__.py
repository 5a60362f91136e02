"""The test method: what turns a :class:`~vgct_ext.PairedStats` into a verdict a component test can trust.

* ``gates``       -- the T1/T2 gates (assert_t1, assert_t2, soft_gates, Relax) and their failure messages;
* ``evidence``    -- recorded evidence and calibration: bars per (component, feature, stratum), the bar rule;
* ``probes``      -- proofs that a feature ran (call counters, compile probes, weight fingerprints);
* ``experiment``  -- capture / save / load of references and repeated runs;
* ``skips``       -- requires_gpu / requires_checkpoint / ... (skip reasons the plugin reports);
* ``plugin``      -- the pytest plugin (markers, the ``vgct`` fixture, the summary, evidence writing);
* ``_context``    -- the per-session state the plugin pushes and the gates read;
* ``_hardware``   -- the device description and stratum (py-cpuinfo for the CPU, ``_C`` for CUDA);
* ``_files``      -- locked, atomic file writes shared by evidence and the plugin.

The method layer builds on :mod:`vgct_ext.core` and never the other way round. Its public names are reachable
as ``vgct_ext.<name>`` (loaded on first use) and its modules under their stable paths ``vgct_ext.gates``,
``vgct_ext.probes``, ``vgct_ext.evidence``, ``vgct_ext.experiment``, ``vgct_ext.skips``, ``vgct_ext.plugin``.
Importing this package imports none of them (and never torch).
"""
