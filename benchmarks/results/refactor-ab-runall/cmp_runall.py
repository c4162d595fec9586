"""Compare before.r / after.r run_all outputs: per key metric, median over rounds, ratio after/before."""
import json, glob, os, statistics, sys
root = sys.argv[1]
def load(v):
    out = {}
    for d in sorted(glob.glob(f"{root}/{v}.[0-9]")):
        for f in glob.glob(f"{d}/*.json"):
            name = os.path.basename(f).rsplit('.', 2)[0]
            try: j = json.load(open(f))
            except Exception: continue
            for row in j.get("rows", []):
                if "bytes" in row and "time_us" in row:
                    if row["bytes"] in (8, 4096, 1 << 20, 64 << 20, 256 << 20, 1024, 1 << 22, 1 << 26):
                        out.setdefault((name, f'{row["bytes"]} B', "time_us"), []).append(row["time_us"])
                elif "median_ms" in row:
                    out.setdefault((name, row["system"][:48], "median_ms"), []).append(row["median_ms"])
                elif "median_us" in row:
                    out.setdefault((name, row["system"][:48], "median_us"), []).append(row["median_us"])
    return out
b, a = load("before"), load("after")
print(f"{'benchmark':<22} {'row':<50} {'metric':<10} {'before':>10} {'after':>10} {'ratio':>6}  (before runs / after runs)")
for k in sorted(b):
    if k not in a: continue
    mb, ma = statistics.median(b[k]), statistics.median(a[k])
    print(f"{k[0]:<22} {k[1]:<50} {k[2]:<10} {mb:>10.3f} {ma:>10.3f} {ma/mb if mb else float('nan'):>6.2f}  {[round(x,2) for x in b[k]]} / {[round(x,2) for x in a[k]]}")
