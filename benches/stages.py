#!/usr/bin/env python3
"""Where a short run's time goes: the median time between consecutive
debug events of `hull -vv run --tier T --project DIR -- true` over N runs,
and the median wall time (with -vv's own output).

  fresh: a new empty project in the default TMPDIR for every run (as
         harnesses make them); otherwise one project, used again.

Usage: benches/stages.py [--hull PATH] [--tier T] [-n N] [--fresh]
"""
import argparse, collections, re, statistics, subprocess, tempfile, time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
EVENT = re.compile(r"([0-9.]+)s\s+DEBUG\s+(.*)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/release/hull")
    ap.add_argument("--tier", default="landlock")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    stages = collections.OrderedDict()
    walls = []
    project = tempfile.mkdtemp(prefix="hull-bench-stages-")
    for _ in range(args.n):
        if args.fresh:
            project = tempfile.mkdtemp(prefix="hull-bench-stages-")
        t = time.perf_counter()
        r = subprocess.run([args.hull, "-vv", "run", "--tier", args.tier, "--project", project,
                            "--", "true"], capture_output=True, text=True, timeout=60)
        walls.append((time.perf_counter() - t) * 1000)
        if r.returncode != 0:
            raise SystemExit(f"hull failed ({r.returncode}):\n{r.stderr}")
        prev, prev_name = 0.0, "logging up"
        for line in r.stderr.splitlines():
            m = EVENT.match(ANSI.sub("", line).strip())
            if not m:
                continue
            at = float(m.group(1)) * 1000
            name = re.sub(r"\s\S+=.*", "", m.group(2)).strip()
            stages.setdefault(f"{prev_name} -> {name}", []).append(at - prev)
            prev, prev_name = at, name
    print(f"tier {args.tier}, {'fresh' if args.fresh else 'used'} project, {args.n} runs (medians)")
    for k, v in stages.items():
        print(f"  {statistics.median(v):7.2f} ms  {k}")
    print(f"  {statistics.median(walls):7.2f} ms  wall, process start to exit (with -vv)")


if __name__ == "__main__":
    main()
