"""What the package reads and writes on FX graphs, in one place.

* ``meta``: node metadata: the stream a node runs on, its phase (forward or backward), the
  partitioner's tags, what a pass recorded, the device a node's work runs on;
* ``ops``: the sync ops (``streams::*``, and the package's own where torch lacks one);
* ``control_deps``: reading a sync wrapped in ``control_deps``, and its passthroughs.
* ``subgraphs``: the graphs a graph calls (higher-order ops' bodies), found one way.
* ``record_and_wait``: the one place passes insert a record and a wait.
"""
