"""kiln's switches, read by the engine when it needs them.

``suppress_fallback_warnings``: when a compiled function runs entirely eagerly (a construct kiln
cannot capture, a result that needs autograd, the cache limit), kiln warns once per function
with the reason. True silences those warnings (the reasons stay in ``kiln.explain``,
``kiln.stats()`` and the ``KILN_LOGS=fallback`` log). The environment variable
``KILN_SUPPRESS_WARNINGS=1`` sets it at import.

``optimize_ddp`` (as ``torch._dynamo.config.optimize_ddp``): a training graph compiled inside
DistributedDataParallel's forward gets its backward cut at DDP's bucket boundaries, so that each
bucket's all-reduce overlaps the rest of the backward. False keeps the backward one program (all
buckets all-reduce after it). Read when a graph is compiled.
"""
import os

suppress_fallback_warnings: bool = os.environ.get("KILN_SUPPRESS_WARNINGS", "") not in ("", "0")

optimize_ddp: bool = True
