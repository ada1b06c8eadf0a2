"""Moved: the kernel sweep is kdengine.bench.kernel (one measurement core with asv, pytest-benchmark and
`kdengine bench`). This name stays only while ci/gpu/cuda_kernel.sh and ci/record.py still call it.

    python -m kdengine.ops.bench_kernel measure|render|once ...  ==  python -m kdengine.bench.kernel ...
"""

from __future__ import annotations

import sys

from kdengine.bench.kernel import main as _main
from kdengine.bench.kernel import render_doc  # noqa: F401 - ci/record.py imports it from here


def main(argv=None) -> int:
    return _main(argv, prog="python -m kdengine.ops.bench_kernel")


if __name__ == "__main__":
    sys.exit(main())
