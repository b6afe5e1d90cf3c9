#!/usr/bin/env python3
"""Where a run's CPU-seconds go, by kind of process: what `make test`'s phases cannot show (its two
cores are busy throughout, so only fewer CPU-seconds make it shorter). Linux, standard library only.

    python3 scripts/cpu_by_process.py record build/cpu.json &   # beside `make test`; SIGTERM writes the file
    python3 scripts/cpu_by_process.py report build/cpu.json [--since EPOCH]

`record` reads /proc every --interval seconds and keeps each process's last user + system time and its
command line as first seen (before vLLM retitles its engine and worker, which are then spawned
`multiprocessing` children); a command line equal to its parent's is read again at the next poll
(a fork seen before its exec, which a loaded machine makes likely). A process that lives less than
that may be missed: the short ones cost little. `report` sums them by KINDS (the first pattern that matches the command line).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import signal
import sys
import time

INTERVAL_S = 1.0
KINDS = (  # (kind, regular expression on the command line), first match wins
    ("vLLM engine core / worker (spawned)", r"multiprocessing\.spawn import spawn_main|^VLLM::"),
    ("vLLM API server (entrypoint.py, vllm serve)", r"entrypoint\.py(?! --dry-run)|vllm_cli serve|\bvllm serve"),
    ("vllm bench serve cell", r"vllm_cli bench serve|bench_client bench"),
    ("parity (HF fp32 reference, requests)", r"tools\.parity"),
    ("schemathesis (fuzz slice)", r"/bin/st "),
    ("launcher dry run", r"entrypoint\.py --dry-run"),
    ("pytest and its xdist workers", r"-m ?pytest\b|exec\(eval\(sys\.stdin"),
    ("other python", r"python"),
)


def record(out: pathlib.Path, interval: float = INTERVAL_S) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    seen: dict[str, list] = {}  # "pid:start tick" -> [cpu seconds, command line, start epoch]
    commands: dict[str, str] = {}  # pid -> its command line as last read

    def write(*_: object) -> None:
        out.write_text(json.dumps(seen))
        sys.exit(0)

    signal.signal(signal.SIGTERM, write)
    signal.signal(signal.SIGINT, write)
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / ticks
                key, parent = f"{pid}:{fields[19]}", fields[1]
                if key not in seen or seen[key][1] == commands.get(parent):
                    commands[pid] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
                    seen[key] = [cpu, commands[pid], boot + int(fields[19]) / ticks]
                seen[key][0] = cpu
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
        time.sleep(interval)


def kind(command: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, command)), "other")


def report(path: pathlib.Path, since: float = 0.0) -> str:
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for cpu, command, started in json.loads(path.read_text()).values():
        if started >= since:
            name = kind(command)
            seconds[name] += cpu
            count[name] += 1
    total = sum(seconds.values()) or 1.0
    rows = [f"| {name} | {count[name]} | {s:.0f} | {100 * s / total:.0f} % |" for name, s in seconds.most_common()]
    return "\n".join(["| processes | count | CPU-seconds | share |", "|---|---:|---:|---:|", *rows,
                      f"| all | {sum(count.values())} | {total:.0f} | |"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="poll /proc until SIGTERM or Ctrl-C, then write FILE")
    rec.add_argument("file", type=pathlib.Path)
    rec.add_argument("--interval", type=float, default=INTERVAL_S, help=f"seconds between polls (default {INTERVAL_S:g})")
    rep = sub.add_parser("report", help="CPU-seconds by kind of process, in Markdown")
    rep.add_argument("file", type=pathlib.Path)
    rep.add_argument("--since", type=float, default=0.0, help="only processes started at or after this epoch")
    args = parser.parse_args()
    if args.command == "record":
        record(args.file, args.interval)
    print(report(args.file, args.since))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
