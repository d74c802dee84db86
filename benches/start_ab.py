#!/usr/bin/env python3
"""Two hull builds paired: `hull run --tier T --project DIR -- true` with
build A and build B alternating (which goes first swaps every round), so
the machine's drift falls on both alike. Per tier, in one project used
again ("used") and in a new empty project each run ("fresh", as harnesses
make them), projects in the default TMPDIR. Prints the medians and B - A.

Usage: benches/start_ab.py --a OLD_HULL --b NEW_HULL [--rounds N] [--tier T ...]
"""
import argparse, statistics, subprocess, tempfile, time


def timed(hull, tier, project):
    t = time.perf_counter()
    r = subprocess.run([hull, "run", "--tier", tier, "--project", project, "--", "true"],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"{hull} failed ({r.returncode}):\n{r.stderr.decode()}")
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the build before")
    ap.add_argument("--b", required=True, help="the build after")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tier", action="append", default=None)
    args = ap.parse_args()
    for tier in args.tier or ["bwrap", "landlock"]:
        for fresh in (False, True):
            used = tempfile.mkdtemp(prefix="hull-bench-ab-")
            times = {args.a: [], args.b: []}
            for i in range(args.rounds):
                order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
                for hull in order:
                    project = tempfile.mkdtemp(prefix="hull-bench-ab-") if fresh else used
                    times[hull].append(timed(hull, tier, project))
            a, b = statistics.median(times[args.a]), statistics.median(times[args.b])
            kind = "fresh" if fresh else "used"
            print(f"{tier:9} {kind:5}  A {a:6.2f} ms  B {b:6.2f} ms  B - A {b - a:+6.2f} ms"
                  f"  (n={args.rounds} pairs)")


if __name__ == "__main__":
    main()
