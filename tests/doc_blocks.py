"""Generated text in the README and docs/: each page holds it between `<!-- TAG:NAME -->` and
`<!-- /TAG -->`, and a results script (`bench/docs_figures.py`, `reliability/docs_table.py`)
replaces what is between with text made from its committed results."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(text, tag, name, body):
    """`text` with the block `tag:name` holding `body`; a page without the block is an error."""
    pattern = re.compile(rf"(<!-- {tag}:{name} -->\n).*?(<!-- /{tag} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- {tag}:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body.strip("\n") + "\n" + m.group(2), text)


def fill_pages(tag, pages, made):
    """Fills, in each page (relative to the repository) of `pages`, the blocks it names from `made`."""
    for page, names in pages.items():
        path = os.path.join(ROOT, page)
        with open(path) as f:
            text = f.read()
        for name in names:
            text = fill(text, tag, name, made[name])
        with open(path, "w") as f:
            f.write(text)
    print(f"{tag}: filled " + ", ".join(pages))
