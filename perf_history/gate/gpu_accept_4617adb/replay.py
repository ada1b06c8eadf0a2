"""Re-judge stored H200 gate runs with this checkout's decision code: every row that had confirmation rounds is
confirmed again from its stored interleaved round medians (real GPU runs), the trades of the measured commit (git, its
Perf-Accepted trailers) applied, and the verdicts, exit code and trade notes printed. A row is confirmed from the rounds
`ci perf` now measures for it: up to the first round at which ci.perf.confirmed() holds (a confirmed row is not measured
again; the runs stored before that rule measured every suspect in every round).

    python replay.py                                  the four runs of perf_history/gate/gpu_accept_4617adb/
    python replay.py DIR RUN.json[:COMMIT] ...        other runs (COMMIT: the plant whose trailers apply)

A plant's commit lives on a local branch of the session that ran it; where git no longer has it, its trailers are read
from planted.patch beside the run's JSON (`git show` or `git format-patch` of that commit)."""
import copy, json, os, re, subprocess, sys, tomllib
from ci import accept, gate, perf


def trailers(commit, directory):
    """The Perf-Accepted trailers of `commit`: from git, else from directory/planted.patch if it is that commit's."""
    if subprocess.run(["git", "cat-file", "-e", commit + "^{commit}"], capture_output=True).returncode == 0:
        return accept.read(".", commit + "^", commit)[0]
    text = open(directory + "planted.patch").read()
    message = text.split("\ndiff --git", 1)[0]
    sha = re.search(r"^(?:From|commit) ([0-9a-f]{40})", message, re.M)
    if not sha or not sha[1].startswith(commit):
        sys.exit(f"{commit}: not in git, and {directory}planted.patch is another commit's")
    return [accept.parse_value(v, sha[1]) for v in re.findall(r"^\s*Perf-Accepted:\s*(.+)$", message, re.M)]


config = tomllib.loads(open("ci/thresholds.toml").read())
DIR = "perf_history/gate/gpu_accept_4617adb/"
RUNS = [("run1_d8a47510c2.json", None), ("call2/run0_f05750e7c2.json", None),
        ("run2_ba18f109b4.json", "ba18f10"), ("call2/run1_d6a41910a8.json", "d6a4191")]
if len(sys.argv) > 2:
    DIR = sys.argv[1].rstrip("/") + "/"
    RUNS = [(arg.partition(":")[0], arg.partition(":")[2] or None) for arg in sys.argv[2:]]
for path, commit in RUNS:
    doc = json.load(open(DIR + path))
    rows = []
    for b in copy.deepcopy(doc["benchmarks"]):
        c = b.get("confirmation")
        if c:
            b["verdict"] = c["first_pass"]
            b.pop("acceptance", None)
            base, head = c["base"], c["head"]
            for k in range(perf.MIN_ROUNDS, min(len(base), len(head)) + 1):
                if perf.confirmed(b, {"base": base[:k], "head": head[:k]}, config):
                    base, head = base[:k], head[:k]
                    break
            gate.confirm(b, base, head, config)
        rows.append(b)
    acc = []
    if commit:
        acc = trailers(commit, os.path.join(DIR, os.path.dirname(path), ""))
        acc = [a._asdict() if hasattr(a, "_asdict") else dict(vars(a)) if not isinstance(a, dict) else a for a in acc]
    out = gate.summarize(doc["base"], doc["head"], [{"machine": "h200", "notes": [], "benchmarks": rows}], acc)
    stored = {b["name"]: b["verdict"] for b in doc["benchmarks"]}
    print(f"{path}: exit {out['exit_code']} (stored {doc['exit_code']})")
    for b in out["benchmarks"]:
        same = "same" if stored[b["name"]] == b["verdict"] else f"STORED {stored[b['name']]}"
        print(f"  {b['name']:28s} {b['verdict']:10s} {b.get('worse') or 0:+.2%}  {same}")
    for n in out.get("accept_notes", []):
        print("  note:", n)
