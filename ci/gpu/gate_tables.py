"""Print a stored gate run's rows as a markdown table, for a gate check's README (the figures come from the JSON
that `ci perf` wrote on the GPU, never typed).

    python ci/gpu/gate_tables.py DIR/run0_<sha>.json [DIR/run1_<sha>.json ...]

One table per run: base and head medians, the first-pass change and verdict, each confirmation round's medians (base /
head, in the order measured) and the final verdict."""
import json
import sys


def us(seconds):
    return f"{seconds * 1e6:.2f}"


def table(path):
    doc = json.load(open(path))
    lines = [f"### {path.rsplit('/', 1)[-1]}: exit {doc['exit_code']}, first pass {doc['first_pass']}, "
             f"final {doc['counts']}", "",
             "| row | base us | head us | change | first pass | confirmation rounds (base / head, us) | verdict |",
             "|---|---|---|---|---|---|---|"]
    for b in sorted(doc["benchmarks"], key=lambda b: b["name"]):
        c = b.get("confirmation")
        rounds = "-"
        if c:
            rounds = " ".join(map(us, c["base"])) + " / " + " ".join(map(us, c["head"]))
        first = c["first_pass"] if c else b["verdict"]
        lines.append(f"| {b['name']} | {us(b['base'])} | {us(b['head'])} | {b['change']:+.2%} | {first} | {rounds} "
                     f"| {b['verdict']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n\n".join(table(p) for p in sys.argv[1:]))
