#!/usr/bin/env python3
"""Copy-on-write runs (`hull run --cow`) against plain runs, and change sets
of many files.

  build:  the zlib workload of tests/tests/workloads.rs (configure, make -j,
          make test) on the tier (bwrap, or vm), plain and with --cow, interleaved round by
          round, each in a fresh copy of its sources (not timed): median,
          min, max and the ratio (the --cow time includes the baseline, the
          scan of the upper layer and writing the set).
  many:   a --cow run that writes N files (default 10,000) of 100 bytes,
          then `hull changes show --json`, `hull changes apply` and
          `hull changes discard` of its set, timed.

As root (bwrap's --cow mounts the overlay as root). The zlib sources come
from the tests' cache: run the workload tests once first.

Usage: benches/cow.py [--hull PATH] [--tier bwrap|vm] [--rounds N] [--files N]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                     "hull-tests", "workloads", "zlib-bookworm")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZLIB = ("./configure --static >build.log 2>&1 && make -j\"$(nproc)\" >>build.log 2>&1 "
        "&& make test >test.log 2>&1")


def timed(argv, env, **kw):
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, **kw)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{argv[:4]}: exit {r.returncode}\n{r.stderr.decode()[-2000:]}")
    return dt, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/debug/hull")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--tier", default="bwrap", choices=["bwrap", "vm"])
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    if not os.path.isdir(CACHE):
        sys.exit(f"{CACHE} is missing: run the workload tests once first")
    scratch = tempfile.mkdtemp(prefix="hull-bench-cow-")
    env = dict(os.environ, HULL_CHANGES_DIR=os.path.join(scratch, "changes"))
    policy = open(os.path.join(ROOT, "policies/default.toml")).read() + 'PATH = "/usr/bin:/bin"\n'
    pol = os.path.join(scratch, "p.toml")
    open(pol, "w").write(policy)
    proj = os.path.join(scratch, "zlib")
    times = {"plain": [], "cow": []}
    for _ in range(a.rounds):
        for label in ("plain", "cow"):
            shutil.rmtree(proj, ignore_errors=True)
            subprocess.run(["cp", "-a", CACHE, proj], check=True)
            extra = ["--cow"] if label == "cow" else []
            dt, _ = timed([hull, "run", "--tier", a.tier, "--policy", pol, "--project", proj,
                           "--timeout", "300s"] + extra + ["--", "sh", "-c", ZLIB], env)
            times[label].append(dt)
    print(f"| zlib on {a.tier} | median | min | max |")
    print("|---|---|---|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts):.2f} s | {min(ts):.2f} | {max(ts):.2f} |")
    print(f"ratio cow/plain: {statistics.median(times['cow']) / statistics.median(times['plain']):.3f}")

    many = os.path.join(scratch, "many")
    os.makedirs(many)
    write = (f"i=0; mkdir -p out; while [ $i -lt {a.files} ]; do "
             "printf '%0100d' $i > out/f$i; i=$((i+1)); done")
    dt_run, r = timed([hull, "run", "--tier", a.tier, "--project", many, "--cow",
                       "--timeout", "600s", "--", "sh", "-c", write], env)
    line = [l for l in r.stderr.decode().splitlines() if l.startswith("hull: changes kept as ")][0]
    cid = line.split()[4].rstrip(";")
    dt_show, r = timed([hull, "changes", "show", cid, "--json"], env)
    n = len(json.loads(r.stdout)["changes"])
    dt_apply, _ = timed([hull, "changes", "apply", cid], env)
    got = len(os.listdir(os.path.join(many, "out")))
    dt_discard, _ = timed([hull, "changes", "discard", cid], env)
    print(f"\n{a.files} files: --cow run (writes, then baseline+scan+save) {dt_run:.2f} s; "
          f"show --json {dt_show:.2f} s ({n} changes); apply {dt_apply:.2f} s ({got} files landed); "
          f"discard {dt_discard:.2f} s")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
