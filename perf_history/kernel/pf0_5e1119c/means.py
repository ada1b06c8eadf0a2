"""The two 8-row sets (pf0_ab8_r1.json, pf0_ab8_r2.json; rows A B B A B A A B, A = seesaw2_el before the prefetch,
B = the probe seesaw2_pf0): per size, each side's row medians, the difference of the sides' means, and whether every
B row lies below every A row. `python means.py > means.txt`."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    print("| set | size | A rows (us) | B rows (us) | mean B - mean A (us) | every B below every A |\n|---|---|---|---|---|---|")
    for r in (1, 2):
        doc = json.loads((HERE / f"pf0_ab8_r{r}.json").read_text())
        for size, rows in doc["sizes"].items():
            a = [v["median_us"] for k, v in rows.items() if k.split("/")[:2] == ["K8", "cuda_sm90_seesaw2_el"]]
            b = [v["median_us"] for k, v in rows.items() if k.split("/")[:2] == ["K8", "cuda_sm90_seesaw2_pf0"]]
            print(f"| r{r} | {size} | {', '.join(f'{x:.2f}' for x in a)} | {', '.join(f'{x:.2f}' for x in b)} "
                  f"| {sum(b) / len(b) - sum(a) / len(a):+.2f} | {max(b) < min(a)} |")


if __name__ == "__main__":
    main()
