"""Benchmarks for torch_userstreams: what the package costs against native torch.compile.

Run ``python -m benchmarks [--quick] [--json PATH] [--calls N]``. Every benchmark measures
package and native in the same process, toggling ``torch_userstreams.install()`` and
``uninstall()`` around a fresh ``torch._dynamo.reset()``, so the two differ only by the patch.
"""
