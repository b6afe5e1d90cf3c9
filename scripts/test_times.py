#!/usr/bin/env python3
"""Where `make test`'s time goes: the per-file table (and the slowest tests) from the JUnit XML files
that `make test` writes to build/test-times/ (one per pytest run), in Markdown for
docs/development.md. Standard library only.

    python3 scripts/test_times.py build/test-times/*.xml [--top N]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import xml.etree.ElementTree as ET


def cases(path: pathlib.Path) -> list[tuple[str, str, float]]:
    """(file, test name, seconds incl. setup and teardown) of every test case in one JUnit file."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "")
        found.append((module.replace(".", "/") + ".py", case.get("name", ""), float(case.get("time", 0))))
    return found


def table(path: pathlib.Path, top: int) -> str:
    runs = cases(path)
    per_file: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for file, _, seconds in runs:
        per_file[file] += seconds
        counts[file] += 1
    total = sum(per_file.values())
    lines = [f"### {path.stem}: {len(runs)} tests, {total:.0f} s", "",
             "| file | tests | seconds | share |", "|---|---:|---:|---:|"]
    lines += [f"| {file} | {counts[file]} | {seconds:.0f} | {100 * seconds / (total or 1):.0f} % |"
              for file, seconds in per_file.most_common()]
    lines += ["", f"Slowest {top}:", "", "| test | seconds |", "|---|---:|"]
    lines += [f"| {file.removesuffix('.py')}::{name} | {seconds:.1f} |"
              for file, name, seconds in sorted(runs, key=lambda c: -c[2])[:top]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path, help="JUnit XML files (build/test-times/*.xml)")
    parser.add_argument("--top", type=int, default=10, help="slowest tests listed per file (default 10)")
    args = parser.parse_args()
    print("\n\n".join(table(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
