#!/usr/bin/env python3
"""Checks the references to docs/results (run from anywhere in the repository: `python3
scripts/check-results.py`; exit status 1 on a finding).

1. Every path under docs/results that a tracked text file names exists: `docs/results/...`
   anywhere (globs `*` and braces `{json,md}` expanded), a folder's name alone
   (`2026-11-26-2xh100-faults-run3/...`) in the documents, and `../NAME/` in the results' own
   READMEs.
2. Every folder of docs/results is in its index (docs/results/README.md) and the index names
   no folder that is not there.
3. Every folder of docs/results is cited by a document outside docs/results (README.md,
   docs/*.md, the code): the evidence kept is the evidence cited.
"""
import glob
import os
import re
import subprocess
import sys

root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                      check=True).stdout.strip()
os.chdir(root)
RESULTS = "docs/results"
INDEX = RESULTS + "/README.md"
END = r"(?:[^\s`'\")\]|,;<>{]|\{[^}\s]*\})*"  # a path's characters; braces whole
FULL = re.compile(r"docs/results(?:/" + END + ")?")
BARE = re.compile(r"(?<![\w/.-])(20\d\d-\d\d-\d\d-\d+xh\d00-[a-z0-9-]+)((?:/" + END + ")?)")
UP = re.compile(r"\.\./([\w.-]+/" + END + ")")


def expand(path):
    """The paths a reference stands for: braces expanded, then globs."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m:
        return [p for alt in m.group(1).split(",")
                for p in expand(path[:m.start()] + alt + path[m.end():])]
    path = path.rstrip(".:")
    if "*" in path or "?" in path:
        return glob.glob(path) or [path]
    return [path]


def exists(ref):
    return all(os.path.exists(p) for p in expand(ref))


files = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                       check=True).stdout.split("\n")
folders = sorted(d for d in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, d)))
missing, cited = [], {}
refs = 0
for f in files:
    if not f or not os.path.isfile(f):
        continue
    inside = f.startswith(RESULTS + "/")
    if inside and not f.endswith(".md"):
        continue  # the evidence itself: logs, JSON, tables
    try:
        text = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    found = []
    for m in FULL.finditer(text):
        found.append((m.start(), m.group(0)))
    for m in BARE.finditer(text):
        if not text[max(0, m.start() - 13):m.start()].endswith("docs/results/"):
            found.append((m.start(), RESULTS + "/" + m.group(1) + m.group(2)))
    if inside:
        base = os.path.dirname(f)
        for m in UP.finditer(text):
            found.append((m.start(), os.path.normpath(os.path.join(base, "..", m.group(1)))))
    for at, ref in found:
        refs += 1
        line = text.count("\n", 0, at) + 1
        if not exists(ref):
            missing.append(f"{f}:{line}: {ref}")
        top = ref[len(RESULTS) + 1:].split("/")[0]
        if not inside and f != INDEX and top in folders:
            cited.setdefault(top, []).append(f"{f}:{line}")

index = open(INDEX, encoding="utf-8").read() if os.path.exists(INDEX) else ""
listed = set(re.findall(r"^\| `([^`/]+)/` \|", index, re.M))
problems = [f"missing: {m}" for m in missing]
problems += [f"not in {INDEX}: {d}/" for d in folders if d not in listed]
problems += [f"in {INDEX} but not a folder: {d}/" for d in sorted(listed) if d not in folders]
problems += [f"cited by no document: {RESULTS}/{d}/" for d in folders if d not in cited]
loose = [e for e in os.listdir(RESULTS) if os.path.isfile(os.path.join(RESULTS, e))
         and e != "README.md"]
problems += [f"a loose file (results go in a folder): {RESULTS}/{e}" for e in sorted(loose)]

print(f"{refs} references to {RESULTS} checked, {len(folders)} folders, "
      f"{sum(1 for d in folders if d in cited)} cited, {len(listed)} in the index")
for p in problems:
    print(p)
print("ok" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
