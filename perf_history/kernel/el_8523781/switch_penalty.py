"""The cost of following another kernel's code, from A B B A records: `python switch_penalty.py > switch_penalty.txt`.

In timer.time_gpu_interleaved each round is rotated, so a row mostly runs right after the row before it.
- Rows 2 (B) and 4 (A again) follow the other kernel; rows 1 and 3 follow their own.
- With row medians r1..r4, (r2 - r1) = d + p and (r4 - r3) = -d + p, where d is B's true difference and p is the
  extra cost of a row that follows the other code.
- So p = ((r2 - r1) + (r4 - r3)) / 2, per size and form.
Records:
- el_9fb95fb, el_8523781 (seesaw2 against seesaw2_el: two split kernels' code);
- merge_ab_999594e (merge 4 against 7 after one split kernel);
- ready_6e467ca (merge 7 against the ready merge; one split kernel's code)."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
RECORDS = ("el_9fb95fb/sched_ab_seesaw2_el_9fb95fb.json", "el_8523781/sched_ab_seesaw2_el_8523781.json",
           "merge_ab_999594e/merge_ab_999594e_0.json", "ready_6e467ca/merge_ab_ready_6e467ca.json")


def main() -> None:
    print("| record | form | p at each size (us), in the record's order |\n|---|---|---|")
    for rec in RECORDS:
        d = json.loads((HERE / rec).read_text())
        by_form: dict[str, list[str]] = {}
        for size, rows in d["sizes"].items():
            for form in sorted({k.split("/")[0] for k in rows if not k.startswith("check")}):
                v = [rows[k]["median_us"] for k in rows if k.startswith(form + "/")]
                if len(v) == 4:
                    by_form.setdefault(form, []).append(f"{size} {(v[1] - v[0] + v[3] - v[2]) / 2:+.2f}")
        for form, cells in by_form.items():
            print(f"| {rec.split('/')[0]} | {form} | {', '.join(cells)} |")


if __name__ == "__main__":
    main()
