"""Collates the ratios of `make bench BENCH_SCALE=small` runs of two commits taken in turns
(before, after, before, after) into one table: for each ratio, each run's value, the spread of
the same commit's runs (its run-to-run noise) and whether the after runs fall within the before
runs widened by that noise. Usage: ab_compare.py OUT_BASENAME label=latest.json ..."""
import json
import sys


def main():
    out = sys.argv[1]
    runs = []
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        d = json.load(open(path))
        runs.append((label, d.get("commit", "?"), d["ratios"]))
    names = sorted({k for _, _, r in runs for k, v in r.items() if isinstance(v, (int, float))})
    rows = []
    for k in names:
        before = [r[k] for label, _, r in runs if label.startswith("before") and isinstance(r.get(k), (int, float))]
        after = [r[k] for label, _, r in runs if label.startswith("after") and isinstance(r.get(k), (int, float))]
        if not before or not after:
            continue
        noise = max(max(before) - min(before), max(after) - min(after))
        lo, hi = min(before) - noise, max(before) + noise
        within = all(lo <= a <= hi for a in after)
        rows.append({"ratio": k, "before": before, "after": after, "noise": noise, "within_noise": within})
    json.dump({"runs": [(label, commit) for label, commit, _ in runs], "rows": rows}, open(out + ".json", "w"), indent=1)
    lines = ["| ratio | " + " | ".join(f"{label} ({commit})" for label, commit, _ in runs) + " | within noise |",
             "|---|" + "---:|" * len(runs) + "---|"]
    for row in rows:
        vals = []
        for label, _, r in runs:
            v = r.get(row["ratio"])
            vals.append(f"{v:.3f}" if isinstance(v, (int, float)) else "")
        lines.append(f"| {row['ratio']} | " + " | ".join(vals) + f" | {'yes' if row['within_noise'] else 'NO'} |")
    open(out + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
