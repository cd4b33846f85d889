"""Each forward and backward graph the ``userstreams`` backend compiles with Inductor, stage
by stage: what the package does to the graph, and inside Inductor, so that its code runs
each node on its stream and issues each sync where the graph put it, and no other.

In the order a graph goes through them (the backend that calls them is
``backends.inductor_graphs``; ``patch.points`` lists the Inductor functions replaced):

* its syncs, placed again after Inductor's joint-graph passes: ``reuse_syncs``;
* its pointwise values and reductions, moved up to what their own stream made, past the
  syncs the partitioner put before them, so that Inductor fuses them (2.11): ``early_values``;
* its pure values that a wait on an event holds before it (torch 2.12+ wraps each sync in
  ``control_deps``), computed after the wait, in the kernels that read them: ``after_waits``;
* its nodes, placed on their streams (torch 2.11, whose Inductor runs one stream):
  ``placed_streams``, and ``pattern_streams`` for the pattern matcher's replacements;
* its syncs, kept where the graph put them by Inductor's scheduler: ``sync_order``;
* the waits its program does not need: ``redundant_syncs``, judged on the lines of its
  code (``sync_lines``) or on its regions;
* its launch code, Inductor's generated ``call``: ``launch_code`` writes the call's
  objects, stream blocks and syncs, with the lines of ``wrapper_lines``;
* or, when asked, its regions per stream, each compiled by Inductor on its own:
  ``regions`` (their launcher is ``run.launcher``'s).
"""
