"""The README's quick starts, as they are written: the fenced block after a `<!-- quickstart:NAME -->`
line. CLI: `python readme_blocks.py README.md NAME` prints it (CI pipes it into python or cc)."""

import re
import sys


def quickstart(readme_text, name):
    m = re.search(r"<!-- quickstart:%s -->\s*```[a-z]*\n(.*?)\n```" % re.escape(name), readme_text, re.S)
    if not m:
        raise SystemExit(f"README has no quickstart:{name} block")
    return m.group(1) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(quickstart(f.read(), sys.argv[2]))
