"""The run-time layer: what happens on each call of a compiled graph, and its backward.

From the bottom: ``state`` (this thread's calls), ``binding`` (one call's objects),
``backward`` (handing a binding to the call's autograd nodes), ``lookup`` (resolving an index
against the right binding), ``bound_graph`` (the per-call runner), ``native`` (native
Dynamo's global table, at the edges of install), ``issue_syncs`` / ``plan`` / ``own_ops``
(executing a graph's syncs and steps).
"""
