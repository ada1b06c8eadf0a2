# Per-mbarrier wait samples of an ncu source-counter CSV (the try_wait and the branch after it, inline part only):
#   python mbar_waits.py src_<schedule>_T64.sass.csv.gz   (offsets: 0x36000 + 8 (9 stage + chunk) full barriers,
#   0x36090 q, 0x36098 m', 0x360a0 m'', 0x360a8 P_a, 0x360b0 P_b, 0x360b8 row sums)
import csv, gzip, sys
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt')))
hdr = rows[1]; data = rows[2:]
ia, isrc, isamp = hdr.index("Address"), hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
tot = sum(int(r[isamp] or 0) for r in data)
# for every SYNCS.PHASECHK, sum samples of it and the following BRA (the wait loop); print the barrier offset
out = []
for k, r in enumerate(data):
    s = r[isrc]
    if "SYNCS.PHASECHK" in s:
        n = int(r[isamp] or 0) + int(data[k + 1][isamp] or 0)
        out.append((n, k, s.strip()))
for n, k, s in sorted(out, reverse=True)[:14]:
    print(f"{100*n/tot:5.1f}% line {k:5d} {s}")
# the retry loops at the end (the try_wait targets out of line)
# every barrier offset, summed over its wait sites (all sites; --all)
if "--all" in sys.argv:
    import collections, re
    agg = collections.Counter()
    for k, r in enumerate(data):
        m = re.search(r"TRYWAIT P0, \[UR\d+\+(0x[0-9a-f]+)\]", r[isrc])
        if m:
            agg[m.group(1)] += int(r[isamp] or 0) + int(data[k + 1][isamp] or 0)
    print("by barrier: " + ", ".join(f"{off} {100 * n / tot:.2f}%" for off, n in sorted(agg.items())))
