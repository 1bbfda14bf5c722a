"""Listings of local directory trees through memarts (the fleet's, or the embedded engine's, `list`:
what `memarts ls`, `warmup`, datasets and fsspec use for local paths) against ``os.walk``: every file
once, none missing, with its size, over random trees of thousands of files, nested and flat. Pages of
1,000 used to continue in an order that changed from page to page, listing some files twice and
others never."""

import os
import random

import memarts as mox


def _tree(root, rng, files):
    """A random tree: directories nested a few deep beside flat ones, names that sort across the
    separator (``a``, ``a-b``, ``a.b``, ``a0``), non-ASCII names, empty directories."""
    stems = ["a", "a-b", "a.b", "a0", "b", "ba", "z", "é", "A", "x y"]
    dirs = [root]
    made = 0
    while made < files:
        parent = rng.choice(dirs)
        path = os.path.join(parent, f"{rng.choice(stems)}{rng.randrange(600)}")
        if os.path.exists(path):
            continue
        if rng.random() < 0.01 and len(dirs) < 40:
            os.mkdir(path)
            dirs.append(path)
        else:
            with open(path, "wb") as f:
                f.write(b"x" * rng.randrange(0, 50))
            made += 1


def _walked(root):
    return {os.path.join(r, f): os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(root) for f in fs}


def test_listings_of_random_local_trees_match_os_walk(tmp_path):
    rng = random.Random(29)
    client = mox.file._fleet()
    for case, files in enumerate([2500, 4200, 1001]):
        root = str(tmp_path / f"t{case}")
        os.mkdir(root)
        if case == 1:
            # Flat: thousands of files in one directory.
            for i in range(files):
                with open(os.path.join(root, f"f{rng.randrange(10**9):09d}-{i}"), "wb") as f:
                    f.write(b"y" * (i % 7))
        else:
            _tree(root, rng, files)
        got = [(url, size) for url, is_dir, size in client.list(root, True) if not is_dir]
        urls = [url for url, _ in got]
        assert len(urls) == len(set(urls)), f"case {case}: {len(urls) - len(set(urls))} entries listed twice"
        assert dict(got) == _walked(root), f"case {case}: the listing is not what os.walk finds"
        # One level: the root's files and directories, each once and marked as such.
        level = client.list(root, False)
        assert sorted(url for url, _d, _s in level) == sorted(os.path.join(root, n) for n in os.listdir(root))
        assert all(is_dir == os.path.isdir(url) for url, is_dir, _s in level)
