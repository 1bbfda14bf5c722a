"""Writes the reliability figures of the README and docs/RELIABILITY.md from the committed results
of one `make reliability` run (`tests/reliability/results/latest.{json,md}`).

Each page holds them between `<!-- reliability:NAME -->` and `<!-- /reliability -->`; this replaces
what is between, so that the table beside the code is the one its run printed and the narrative's
totals are that run's. `make reliability` runs it after the campaign.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from doc_blocks import fill_pages  # noqa: E402  (tests/doc_blocks.py)

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def gib(n):
    return f"{n / (1 << 30):,.1f} GiB"


def blocks(latest, table_md):
    rows = latest["rows"]
    table = "\n".join(line for line in table_md.splitlines() if line.startswith("|"))
    minutes = latest["seconds"] / 60
    total = sum(r["bytes_verified"] for r in rows)
    wrong = sum(r["wrong_bytes"] for r in rows)
    lost = sum(r["acked_lost"] for r in rows)
    failed = sum(r["failed_calls"] for r in rows)
    cluster = [r for r in rows if r["class"] == "cluster"]
    head = (f"Latest full run (`make reliability`: the campaign took {minutes:.1f} minutes here after the fuzzers; "
            "2-core VM; figures in `tests/reliability/results/latest.{json,md}`, with a note per row saying what "
            "\"detected\" counts):")
    notes = "\n".join(f"- **{r['class']} / {r['fault']}**: {r['note']}" for r in rows if r.get("note"))
    summary = (f"Every row is verified byte for byte: {wrong} wrong bytes in {gib(total)} read back, {lost} "
               f"acknowledged objects lost, {failed} failed calls where the promise is success; the cluster "
               f"rows (3 nodes, readers on every node) verified {gib(sum(r['bytes_verified'] for r in cluster))}. "
               "\"Expected typed errors\" are the outcomes a promise calls for: a miss while the origin is down, "
               "a pinned read of a replaced object (`Stale`), `NoSpace` on a full disk, refused frames and "
               "connections. What each row injected and what \"detected\" counts there:\n\n" + notes)
    return {"table": head + "\n\n" + table, "summary": summary}


PAGES = {"README.md": ("table",), "docs/RELIABILITY.md": ("summary",)}



def main():
    with open(os.path.join(RESULTS, "latest.json")) as f:
        latest = json.load(f)
    with open(os.path.join(RESULTS, "latest.md")) as f:
        table_md = f.read()
    made = blocks(latest, table_md)
    fill_pages("reliability", PAGES, made)


if __name__ == "__main__":
    sys.exit(main())
