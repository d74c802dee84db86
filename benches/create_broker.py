#!/usr/bin/env python3
"""Paired benchmark of the landlock tier's create broker.

On the landlock tier every open with O_CREAT, mkdir, unlink and rename of a
command stops in its seccomp filter and is answered by hull
(tier/broker/create.rs): in a subdirectory the kernel then runs it
(Landlock decides), at the top of the split project hull places a spare
entry from the run's pool (tier/spares.rs). This measures, inside the
command itself, N create+write+close+unlink cycles in a subdirectory and
at the project's top, under `--tier landlock` and `--tier none` (the same
command, no sandbox, no broker), alternately; and the whole run of `true`
(what making and removing the pool adds to every run).

Usage: benches/create_broker.py [--rounds R] [--files N] [--hull PATH]
"""
import argparse, json, os, random, statistics, subprocess, sys, tempfile, time

WORKLOAD = r'''
import json, os, sys, time
n = int(sys.argv[1])
os.makedirs("sub", exist_ok=True)
def timed(d):
    t0 = time.perf_counter()
    for i in range(n):
        p = os.path.join(d, f"b{i}")
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, b"x"); os.close(fd); os.unlink(p)
    return (time.perf_counter() - t0) / n * 1e6
print(json.dumps({"sub": timed("sub"), "top": timed(".")}))
'''

def one(hull, tier, project, env, argv):
    t0 = time.perf_counter()
    r = subprocess.run([hull, "run", "-q", "--tier", tier, "--project", project,
                        "--timeout", "120s", "--"] + argv,
                       cwd=project, env=env, capture_output=True, stdin=subprocess.DEVNULL)
    wall = (time.perf_counter() - t0) * 1e3
    if r.returncode != 0:
        sys.exit(f"{tier} failed ({r.returncode}): {r.stderr.decode()}")
    return r.stdout.decode(), wall

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--hull", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "hull"))
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    if not os.path.exists(hull):
        sys.exit(f"{hull} missing: cargo build --release -p hull")
    project = tempfile.mkdtemp(prefix="hull-bench-")
    os.makedirs(os.path.join(project, ".git"))
    with open(os.path.join(project, "bench.py"), "w") as f:
        f.write(WORKLOAD)
    env = dict(os.environ, HULL_RUNS_DIR=tempfile.mkdtemp(prefix="hull-bench-runs-"))
    cycles = {"landlock": [], "none": []}
    runs = {"landlock": [], "none": []}
    for tier in ("landlock", "none"):  # warm-up
        one(hull, tier, project, env, ["python3", "bench.py", "10"])
    for _ in range(a.rounds):
        order = ["landlock", "none"]; random.shuffle(order)
        for tier in order:
            out, _ = one(hull, tier, project, env, ["python3", "bench.py", str(a.files)])
            cycles[tier].append(json.loads(out.strip().splitlines()[-1]))
            _, wall = one(hull, tier, project, env, ["true"])
            runs[tier].append(wall)
    print(f"hull {hull}, {a.rounds} rounds, {a.files} create+write+close+unlink cycles each")
    for kind, label in (("sub", "in a subdirectory"), ("top", "at the project's top")):
        l = statistics.median(x[kind] for x in cycles["landlock"])
        n = statistics.median(x[kind] for x in cycles["none"])
        print(f"cycle {label:22}: landlock {l:7.1f} us | none {n:7.1f} us | "
              f"adds {l - n:+7.1f} us | ratio {l / n:5.2f}x")
    l, n = statistics.median(runs["landlock"]), statistics.median(runs["none"])
    print(f"hull run true (wall)         : landlock {l:7.1f} ms | none {n:7.1f} ms | "
          f"adds {l - n:+7.1f} ms | ratio {l / n:5.2f}x")

if __name__ == "__main__":
    main()
