"""Patching torch: what is replaced (``points``), by what (``replacements``, ``fakes``), and
installing and uninstalling it all at once (``install``)."""
