#!/usr/bin/env python3
"""Paired benchmark of the bwrap tier's connect broker.

Every `connect` of a command on the bwrap tier stops in its seccomp filter
and is answered by hull (tier/broker/connect.rs). This measures what that
costs a connect, inside the command itself: N unix-socket connects to a
listener in the project, and N TCP connects to a listener on the sandbox's
loopback, each timed by the command, under `--tier bwrap` and under
`--tier none` (the same command, no sandbox, no broker), alternately.

Usage: benches/connect_broker.py [--rounds R] [--connects N] [--hull PATH]
"""
import argparse, json, os, random, statistics, subprocess, sys, tempfile

WORKLOAD = r'''
import json, os, socket, sys, threading, time
n = int(sys.argv[1])
path = os.path.abspath("bench.sock")
if os.path.exists(path): os.unlink(path)
u = socket.socket(socket.AF_UNIX); u.bind(path); u.listen(128)
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen(128)
def drain(s):
    while True:
        c, _ = s.accept(); c.close()
for s in (u, t):
    threading.Thread(target=drain, args=(s,), daemon=True).start()
def timed(make, addr):
    t0 = time.perf_counter()
    for _ in range(n):
        c = make(); c.connect(addr); c.close()
    return (time.perf_counter() - t0) / n * 1e6
print(json.dumps({"unix": timed(lambda: socket.socket(socket.AF_UNIX), path),
                  "tcp": timed(socket.socket, t.getsockname())}))
'''

def one(hull, tier, project, env, n):
    r = subprocess.run([hull, "run", "--tier", tier, "--project", project, "--timeout", "120s",
                        "--", "python3", "bench.py", str(n)],
                       cwd=project, env=env, capture_output=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"{tier} failed ({r.returncode}): {r.stderr.decode()}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--connects", type=int, default=2000)
    ap.add_argument("--hull", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "hull"))
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    if not os.path.exists(hull):
        sys.exit(f"{hull} missing: cargo build --release -p hull")
    project = tempfile.mkdtemp(prefix="hull-bench-")
    os.makedirs(os.path.join(project, ".git"))
    os.makedirs(os.path.join(project, ".hull"))
    with open(os.path.join(project, "bench.py"), "w") as f:
        f.write(WORKLOAD)
    env = dict(os.environ, HULL_RUNS_DIR=tempfile.mkdtemp(prefix="hull-bench-runs-"))
    got = {"bwrap": [], "none": []}
    one(hull, "bwrap", project, env, 100); one(hull, "none", project, env, 100)  # warm-up
    for _ in range(a.rounds):
        order = ["bwrap", "none"]; random.shuffle(order)
        for tier in order:
            got[tier].append(one(hull, tier, project, env, a.connects))
    print(f"hull {hull}, {a.rounds} rounds of {a.connects} connects each")
    for kind in ("unix", "tcp"):
        b = statistics.median(x[kind] for x in got["bwrap"])
        n = statistics.median(x[kind] for x in got["none"])
        print(f"{kind:5} connect: bwrap (brokered) {b:7.1f} us | none {n:7.1f} us | "
              f"broker adds {b - n:+7.1f} us | ratio {b / n:5.2f}x")

if __name__ == "__main__":
    main()
