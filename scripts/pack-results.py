#!/usr/bin/env python3
"""Packs the raw text logs of results folders into one file each (run from anywhere in the
repository: `python3 scripts/pack-results.py FOLDER [...]`, each FOLDER a results folder, `--dry-run` to list).

A run leaves a log or summary per test and per phase; a folder keeps them as one `logs.txt`,
each under a line `===== PATH =====` (its path inside the folder), so the evidence stays
readable in one place without hundreds of tracked files. Files that a document names by
their path or file name (the folder's own pages, README.md, docs/, scripts, the code) stay
where they are; JSON, tables and archives are never packed. Packed files are removed with
`git rm`, `logs.txt` is added; a folder with fewer than three files to pack is left alone.
"""
import os
import re
import subprocess
import sys

RAW = (".log", ".err", ".txt", ".out")
GENERIC = ("summary.txt", "tests.log", "logs.txt")  # names too common to count as cited

root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                      check=True).stdout.strip()
args = [a for a in sys.argv[1:] if a != "--dry-run"]
dry = "--dry-run" in sys.argv
if not args:
    sys.exit(__doc__)
folders = [os.path.relpath(os.path.abspath(a), root) for a in args]
os.chdir(root)
files = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                       check=True).stdout.split()


def read(path):
    try:
        return open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return ""


outside = "".join(read(f) for f in files
                  if (f.endswith((".md", ".rs", ".py", ".sh")))
                  and not f.startswith("docs/results/"))
for top in folders:
    inside = [f for f in files if f.startswith(top + "/")]
    own = "".join(read(f) for f in inside if f.endswith(".md"))

    def cited(path):
        rel, name = os.path.relpath(path, top), os.path.basename(path)
        if rel in own or rel in outside:
            return True
        if name in GENERIC:
            return False
        return re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w.-])",
                         own + outside) is not None

    pack = sorted(f for f in inside if f.endswith(RAW) and not cited(f)
                  and os.path.basename(f) != "logs.txt")
    print(f"{top}: {len(pack)} files to pack")
    if dry or len(pack) < 3:
        continue
    out = os.path.join(top, "logs.txt")
    if os.path.exists(out):
        sys.exit(f"{out} exists: pack a folder once")
    with open(out, "w", encoding="utf-8") as o:
        o.write("# The raw logs of this folder, one after another, each under a line "
                "'===== PATH =====' (its path in the folder).\n")
        for f in pack:
            text = open(f, encoding="utf-8", errors="replace").read()
            o.write(f"\n===== {os.path.relpath(f, top)} =====\n")
            o.write(text if not text or text.endswith("\n") else text + "\n")
    subprocess.run(["git", "rm", "-qf", *pack], check=True)  # -f: new, staged logs too
    subprocess.run(["git", "add", out], check=True)
