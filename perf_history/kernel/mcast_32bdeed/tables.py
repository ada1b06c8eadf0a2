"""The README's tables, read from the records (python tables.py, from this folder): timing from the two JSONs,
ncu from each run's raw CSVs, clusters / tests / sanitizers from the logs."""
import csv
import glob
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CTX = {4096: "4k", 16384: "16k", 65536: "65k"}
RUNS = {"run1_1c95466": "1c95466", "run2_32bdeed": "32bdeed"}
SHORT = {"cuda_sm90_seesaw2/sauto": "seesaw2", "cuda_sm90_seesaw2_mc/sauto": "seesaw2_mc",
         "cuda_sm90_seesaw2_mca/sauto": "seesaw2_mca", "cuda_sm90_seesaw2/aa/sauto": "seesaw2/aa", "flashmla": "flashmla"}


def timing(sha):
    d = json.load(open(HERE.parent / f"verify_kernel_mcast_gpu-nvidia-h200-sm90_{sha}.json"))
    rows = []
    for case in d["cases"]:
        res = case["results"]
        cells = [f"{SHORT[k]} {v['median_s'] * 1e6:.1f}" for k, v in res.items() if "median_s" in v]
        base = [res[k]["median_s"] for k in ("cuda_sm90_seesaw2/sauto", "cuda_sm90_seesaw2/aa/sauto")]
        aa = abs(base[1] - base[0]) / min(base) * 100
        rows.append(f"  {CTX[case['N']]} T{case['T']}: " + " / ".join(cells) + f"  (A/A spread {aa:.1f}%)")
    return rows


def ncu(run):
    out = []
    for T in (16, 64):
        path = HERE / run / f"ncu_T{T}.raw.csv"
        log = (HERE / run / f"ncu_T{T}.log").read_text()
        names = re.findall(r"^(\S+) T=\d+ prefix", log, re.M)
        rows = [r for r in csv.DictReader(l for l in open(path) if not l.startswith("=="))][1:]
        out.append(f"  65k T={T}: kernel: us / tensor% / issue% / DRAM% / L2% / lts bytes (MB) / DRAM read (MB) / "
                   "stalls per issue long_scoreboard, wait, barrier, gmma, no_instruction, membar")
        for name, r in zip(names, rows, strict=True):
            g = lambda k, r=r: float(r[k])
            st = ", ".join(f"{g(f'smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio'):.2f}"
                           for s in ("long_scoreboard", "wait", "barrier", "gmma", "no_instruction", "membar"))
            out.append(f"    {name}: {g('gpu__time_duration.sum'):.2f} / "
                       f"{g('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f} / "
                       f"{g('smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f} / "
                       f"{g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} / "
                       f"{g('lts__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} / "
                       f"{g('lts__t_bytes.sum'):.1f} / {g('dram__bytes_read.sum'):.1f} / {st}")
    return out


def checks(run):
    out = []
    for line in (HERE / run / "clusters.log").read_text().splitlines():
        out.append(f"  {line}")
    tests = re.search(r"\d+ passed.*", (HERE / run / "pytest_sm90.log").read_text())
    out.append(f"  pytest tests/ops/test_sm90.py -m gpu -k 'seesaw2 or mc': {tests.group(0) if tests else '?'}")
    for spec in sorted(glob.glob(str(HERE / run / "smoke*.spec")), key=lambda p: int(re.search(r"(\d+)\.spec", p)[1])):
        log = Path(spec[:-5] + ".log").read_text().strip().splitlines()
        out.append(f"  smoke {Path(spec).read_text().strip()}: {log[-1] if log else '?'}")
    for spec in sorted(glob.glob(str(HERE / run / "san*.spec")), key=lambda p: int(re.search(r"(\d+)\.spec", p)[1])):
        log = Path(spec[:-5] + ".log").read_text()
        summary = re.search(r"(RACECHECK SUMMARY|ERROR SUMMARY).*", log)
        out.append(f"  {Path(spec).read_text().strip()}: {summary.group(0) if summary else '?'}")
    return out


if __name__ == "__main__":
    for run, sha in RUNS.items():
        print(f"{run}: timing (verify_kernel_mcast_gpu-nvidia-h200-sm90_{sha}.json), median us")
        print("\n".join(timing(sha)))
        print(f"{run}: ncu, one cold launch each (ncu_T*.raw.csv)")
        print("\n".join(ncu(run)))
        print(f"{run}: clusters, tests, sanitizers")
        print("\n".join(checks(run)))
        print()
