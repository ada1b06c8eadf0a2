"""The summary of a full device run of main (ci/gpu/merged.sh), read from its records and its folder's logs, e.g.:
PYTHONPATH=. python ci/gpu/final_summary.py f192906 > perf_history/kernel/final_f192906/summary.txt"""

import argparse
import json
import re
import sys

from ci.gpu.targets import KERNEL as K
from ci.gpu.targets import ROOT, SIZES, median_us

E = ROOT / "perf_history" / "engine"


def medians(doc: dict, label: str) -> list[float]:
    return [median_us(doc, N, T, label) for N, T in SIZES]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("commit", help="the short sha of the run: its records are *_<commit>_peers.json, "
                    "engine_run_cuda_<commit>{,_rerun}.json and the folder perf_history/kernel/final_<commit>/")
    sha = ap.parse_args(argv).commit
    needed = [K / f"verify_kernel_gpu-nvidia-h200-sm90_{sha}_peers.json", E / f"engine_run_cuda_{sha}.json",
              E / f"engine_run_cuda_{sha}_rerun.json", K / f"final_{sha}" / "pytest_gpu.log"]
    missing = [str(path.relative_to(ROOT)) for path in needed if not path.exists()]
    if missing:
        sys.exit(f"final_summary: no full run of {sha} here (missing {', '.join(missing)})")
    peers = json.loads((K / f"verify_kernel_gpu-nvidia-h200-sm90_{sha}_peers.json").read_text())
    rows = {"cuda": medians(peers, "cuda"), "flashmla": medians(peers, "flashmla"),
            "mma.sync default": medians(peers, peers["default_label"])}
    for name, us in rows.items():
        print(f"{name:18s}", " / ".join(f"{u:.1f}" for u in us), "us (4k T16, 4k T64, 16k T16, 16k T64, 65k T16, 65k T64)")
    print("cuda / flashmla   ", " / ".join(f"{f / c:.3f}x" for c, f in zip(rows["cuda"], rows["flashmla"], strict=True)))
    for tag in ("", "_rerun"):
        runs = json.loads((E / f"engine_run_cuda_{sha}{tag}.json").read_text())["decode"]
        print(f"decode{tag or ' (first)'}:", " / ".join(f"{r['tok_per_s']:.1f}" for r in runs.values()), "tok/s at",
              " / ".join(runs))
    folder = K / f"final_{sha}"
    print("GPU tests:", re.search(r"\d+ passed[^\n]*", (folder / "pytest_gpu.log").read_text()).group(0))
    for i in (1, 2, 3):
        text = (folder / f"aa-{i}.log").read_text()
        print(f"A/A compare {i}:", "failed" if re.search(r"Performance has regressed|FAILED", text) else "passed")


if __name__ == "__main__":
    main()
