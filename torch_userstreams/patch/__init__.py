"""Patching torch: what is replaced (``points``), by what (``replacements``, ``fakes``), and
installing and uninstalling it all at once (``install``). The replacements inside
Inductor's compile of a graph live with their stage, in ``inductor``; ``points`` lists them too."""
