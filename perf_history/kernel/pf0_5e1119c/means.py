"""The two 8-row sets (pf0_ab8_r1.json, pf0_ab8_r2.json; rows A B B A B A A B, A = seesaw2_el before the prefetch,
B = the probe seesaw2_pf0): per size and form (K8: the sweep's 8 calls a sample; K1: one call a sample, each after the
L2 flush), each side's row medians, the difference of the sides' means, and whether every
B row lies below every A row. `python means.py > means.txt`."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    print("| set | size | form | A rows (us) | B rows (us) | mean B - mean A (us) | every B below every A |\n"
          "|---|---|---|---|---|---|---|")
    for r in (1, 2):
        doc = json.loads((HERE / f"pf0_ab8_r{r}.json").read_text())
        for size, rows in doc["sizes"].items():
            for form in ("K8", "K1"):
                a = [v["median_us"] for k, v in rows.items() if k.split("/")[:2] == [form, "cuda_sm90_seesaw2_el"]]
                b = [v["median_us"] for k, v in rows.items() if k.split("/")[:2] == [form, "cuda_sm90_seesaw2_pf0"]]
                print(f"| r{r} | {size} | {form} | {', '.join(f'{x:.2f}' for x in a)} | "
                      f"{', '.join(f'{x:.2f}' for x in b)} | {sum(b) / len(b) - sum(a) / len(a):+.2f} | {max(b) < min(a)} |")


if __name__ == "__main__":
    main()
