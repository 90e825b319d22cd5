"""kiln's switches, read by the engine when it needs them.

``suppress_fallback_warnings``: when a compiled function runs entirely eagerly (a construct kiln
cannot capture, a result that needs autograd, the cache limit), kiln warns once per function
with the reason. True silences those warnings (the reasons stay in ``kiln.explain``,
``kiln.stats()`` and the ``KILN_LOGS=fallback`` log). The environment variable
``KILN_SUPPRESS_WARNINGS=1`` sets it at import.
"""
import os

suppress_fallback_warnings: bool = os.environ.get("KILN_SUPPRESS_WARNINGS", "") not in ("", "0")
