"""`asv publish` of a results directory into a static site directory (for GitHub Pages; never committed).
asv's index.html loads jQuery/flot/bootstrap from CDNs; where ci/assets/node_modules exists (`npm install
--prefix ci/assets`, pinned in ci/assets/package.json) those files are copied into the site and the tags
rewritten, so the site also renders without internet (headless test, closed networks).

asv's JavaScript builds HTML strings from benchmark, parameter and machine names: the results directory is
checked against kdengine.bench.names' character sets first (the checks `ci record` applies on the way in),
and a directory with a name outside them is refused, never published.

`python -m ci publish [--results-dir perf_history] [--site DIR] [--assets DIR]`
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "ci" / "assets" / "node_modules"
# CDN file name (as asv's index.html names it) -> path inside node_modules
VENDORED = {
    "jquery-3.3.1.min.js": "jquery/dist/jquery.min.js",
    "jquery.flot.min.js": "flot/jquery.flot.js",
    "jquery.flot.time.min.js": "flot/jquery.flot.time.js",
    "jquery.flot.selection.min.js": "flot/jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "flot/jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "flot-orderbars/js/jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupid-table-plugin/stupidtable.min.js",
    "md5.min.js": "blueimp-md5/js/md5.min.js",
    "bootstrap.min.js": "bootstrap/dist/js/bootstrap.min.js",
    "bootstrap.min.css": "bootstrap/dist/css/bootstrap.min.css",
}
TAG = re.compile(r'(?P<attr>src|href)="https://[^"]*/(?P<file>[^"/]+)"(?P<rest>[^>]*)>')


def vendor_assets(site: Path, assets: Path) -> int:
    """Copy the CDN files from `assets` into site/vendor and point index.html at them; returns how many."""
    (site / "vendor").mkdir(exist_ok=True)
    count = 0

    def local(m: re.Match) -> str:
        nonlocal count
        source = assets / VENDORED.get(m["file"], "-")
        if not source.is_file():
            return m[0]
        shutil.copyfile(source, site / "vendor" / m["file"])
        count += 1
        rest = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "", m["rest"])
        return f'{m["attr"]}="vendor/{m["file"]}"{rest}>'

    index = site / "index.html"
    index.write_text(TAG.sub(local, index.read_text()))
    return count


def check_site_names(results_dir: Path) -> int:
    """Validate every file asv publish reads (benchmarks.json, machine.json, result files); returns how many.
    A DataError names the first file with a bad name or shape."""
    from ci import record

    machines = record.machines_in(results_dir)
    count = 0
    for path in sorted(Path(results_dir).rglob("*.json")):
        rel = path.relative_to(results_dir)
        if record.classify(rel, machines)[0] in ("benchmarks", "machine", "result"):
            record.validate(path, rel, path.read_bytes(), machines)
            count += 1
    return count


def publish(results_dir: Path, site: Path, repo: Path = ROOT, assets: Path | None = ASSETS) -> Path:
    """Write the asv HTML site for results_dir into site (after check_site_names); returns site/index.html."""
    check_site_names(results_dir)
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
    if assets is not None and assets.is_dir():
        vendor_assets(site, assets)
    return index


def add_parser(sub) -> None:
    p = sub.add_parser("publish", help="asv publish into a site directory (for Pages; not committed)")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--site", default="site", help="output directory (default ./site)")
    p.add_argument("--assets", default=str(ASSETS), help="node_modules with the site's JS (optional)")
    p.set_defaults(func=main)


def main(args) -> int:
    index = publish(Path(args.results_dir), Path(args.site), assets=Path(args.assets))
    print(f"[publish] {index}")
    return 0
