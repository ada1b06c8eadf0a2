"""seesaw2's cost of following other kernel code, from ci/gpu/code_switch.sh's two records of 0391d27:
`python tables.py > tables.txt`.

- code_switch_warm: seesaw2 four times interleaved, so every sample follows seesaw2's own code (and the L2 flush);
- code_switch_cold: seesaw2 and seesaw2_bar (the same schedule with named-barrier hand-offs, the same code size)
  alternating, so every seesaw2 sample follows the other kernel's code.
Per size and form (K calls replayed per sample): seesaw2's rows' median in each set (mean of its row medians), the
rows' range, and cold - warm: the cost of cold instruction caches per replay (at K = 1 per call)."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
A = "cuda_sm90_seesaw2"


def rows(doc: dict, size: str, form: str) -> list[float]:
    return [v["median_us"] for k, v in doc["sizes"][size].items() if k.split("/")[:2] == [form, A]]


def main() -> None:
    warm = json.loads((HERE / "code_switch_warm_0391d27.json").read_text())
    cold = json.loads((HERE / "code_switch_cold_0391d27.json").read_text())
    print("| size | form | warm (4 rows, us) | cold (2 rows, us) | cold - warm (us) |\n|---|---|---|---|---|")
    for size in warm["sizes"]:
        forms = sorted({k.split("/")[0] for k in warm["sizes"][size] if not k.startswith("check")},
                       key=lambda f: int(f[1:]), reverse=True)
        for form in forms:
            w, c = rows(warm, size, form), rows(cold, size, form)
            mw, mc = sum(w) / len(w), sum(c) / len(c)
            print(f"| {size} | {form} | {mw:.2f} ({min(w):.2f}-{max(w):.2f}) | {mc:.2f} ({min(c):.2f}-{max(c):.2f}) "
                  f"| {mc - mw:+.2f} |")


if __name__ == "__main__":
    main()
