"""`asv publish` of a results directory into a static site directory (for GitHub Pages; never committed).

`python -m ci publish [--results-dir perf_history] [--site DIR]`
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def publish(results_dir: Path, site: Path, repo: Path = ROOT) -> Path:
    """Write the asv HTML site for results_dir into site; returns site/index.html."""
    conf = json.loads((repo / "asv.conf.json").read_text()) if (repo / "asv.conf.json").exists() else {
        "version": 1, "project": "kdengine", "environment_type": "existing", "branches": ["main"]}
    conf.update(repo=str(repo), results_dir=str(results_dir.resolve()), html_dir=str(site.resolve()),
                benchmark_dir=str(repo / conf.get("benchmark_dir", "benchmarks")))
    with tempfile.TemporaryDirectory() as tmp:
        conf_path = Path(tmp) / "asv.conf.json"
        conf_path.write_text(json.dumps(conf))
        proc = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(conf_path)],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"asv publish failed ({proc.returncode}): {proc.stdout[-800:]}{proc.stderr[-800:]}")
    index = site / "index.html"
    if not index.exists():
        raise RuntimeError(f"asv publish wrote no {index}")
    return index


def add_parser(sub) -> None:
    p = sub.add_parser("publish", help="asv publish into a site directory (for Pages; not committed)")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--site", default="site", help="output directory (default ./site)")
    p.set_defaults(func=main)


def main(args) -> int:
    index = publish(Path(args.results_dir), Path(args.site))
    print(f"[publish] {index}")
    return 0
