"""The compile-time layer: one ``GraphCompile`` per graph compile, and what it makes.

``graph_compile`` (which compile a registration belongs to, and the requests the backend
and its passes make), ``table`` (the user objects of one graph), ``hook`` (the OutputGraph
hook: the prologue after the backend returned), ``prologue`` / ``emitters`` / ``factories``
(the bytecode that binds one call's objects), ``returned_objects`` (a graph's own object
returned to the caller), ``method_syncs`` (torch 2.11's method-call syncs as sync ops).
"""
