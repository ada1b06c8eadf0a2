"""kdengine: MLA tree-verify attention for speculative decoding, a decode engine around it, and the
performance CI that keeps its speed from regressing.

The public entry point of the kernel half is :func:`kdengine.ops.verify_attention`.
"""

__version__ = "0.1.0"
