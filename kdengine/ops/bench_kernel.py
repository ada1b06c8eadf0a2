"""Moved: the kernel sweep is kdengine.bench.kernel (one measurement core with asv, pytest-benchmark and
`kdengine bench`). No project code calls this name any more (ci/gpu/cuda_kernel.sh and ci/record.py use
kdengine.bench.kernel); it stays for the old command name README.md still promises, tested by
tests/bench/test_kernel.py: delete the three together.

    python -m kdengine.ops.bench_kernel measure|render|once ...  ==  python -m kdengine.bench.kernel ...
"""

from __future__ import annotations

import sys

from kdengine.bench.kernel import main as _main
from kdengine.bench.kernel import render_doc  # noqa: F401 - the old import path


def main(argv=None) -> int:
    return _main(argv, prog="python -m kdengine.ops.bench_kernel")


if __name__ == "__main__":
    sys.exit(main())
