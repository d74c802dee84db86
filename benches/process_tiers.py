#!/usr/bin/env python3
"""Paired benchmark of hull's process tiers against the bare mechanism.

For each pair, the two commands run alternately (random order within each
round) N times; the script prints medians, the difference and the ratio.

  bwrap:    `hull run --tier bwrap -- true`  vs  `bwrap <same argv> -- true`
            (the argv hull would use, from `hull policy explain --json`,
            minus hull's seccomp fd), in a project with `.hull` and `.git`
            (so neither side needs a placeholder); "fresh": hull in a new
            empty project each time, as harnesses make them
  landlock: `hull run --tier landlock -- true`  vs  `true` run directly:
            in that project (its own `.hull` keeps the spare pool), in a
            project used before with no `.hull` ("used"), and in a new
            empty project each time ("fresh")

Usage: benches/process_tiers.py [--rounds N] [--hull PATH]
"""
import argparse, json, os, random, shutil, statistics, subprocess, sys, tempfile, time

def run(argv, env=None, cwd=None):
    t = time.perf_counter()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=env, cwd=cwd)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(argv)}\n{r.stderr.decode()}")
    return dt

def paired(name, a, b, rounds):
    ta, tb = [], []
    for _ in range(3):  # warm-up, not measured
        a(); b()
    for _ in range(rounds):
        if random.random() < 0.5:
            ta.append(a()); tb.append(b())
        else:
            tb.append(b()); ta.append(a())
    ma, mb = statistics.median(ta) * 1000, statistics.median(tb) * 1000
    print(f"{name:14} hull median {ma:7.2f} ms | bare median {mb:7.2f} ms | "
          f"hull adds {ma - mb:+6.2f} ms | ratio {ma / mb:5.2f}x  (n={rounds} pairs)")
    return ma, mb

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--hull", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "hull"))
    args = ap.parse_args()
    hull = os.path.abspath(args.hull)
    if not os.path.exists(hull):
        sys.exit(f"{hull} missing: cargo build --release -p hull")
    project = tempfile.mkdtemp(prefix="hull-bench-")
    runs = tempfile.mkdtemp(prefix="hull-bench-runs-")
    env = dict(os.environ, HULL_RUNS_DIR=runs)
    true = shutil.which("true")
    print(f"hull {hull}\nproject {project}\n")

    ex = subprocess.run([hull, "policy", "explain", "--tier", "bwrap", "--json", "--project", project],
                        env=env, check=True, capture_output=True)
    # Rebuild the bare argv from the same lowering hull uses.
    lines = json.loads(ex.stdout)["tiers"][0]["lines"]
    bare = [shutil.which("bwrap")]
    for l in lines[1:]:
        l = l.strip().rstrip("\\").strip()
        # Only bwrap's options: not comments, not hull's seccomp fd, not the
        # line that says what the network part is.
        if not l.startswith("--") or l.startswith("--seccomp"):
            continue
        bare += l.split()
    # The masks and instance dirs hull creates per run: make them once here.
    inst = os.path.join(runs, "INSTANCE")
    for d in ("tmp", "spill", "mask/dir"):
        os.makedirs(os.path.join(inst, d), exist_ok=True)
    open(os.path.join(inst, "mask/file"), "w").close()
    # The protected names exist, so neither side needs a placeholder (hull
    # removes its placeholders after each run; the bare argv binds them).
    for name in (".hull", ".git"):
        os.makedirs(os.path.join(project, name), exist_ok=True)
    bare += ["--", true]

    def fresh():
        # As harnesses make them: a new directory in the default TMPDIR
        # for each sample, nothing in it.
        return tempfile.mkdtemp(prefix="hull-bench-fresh-")

    def hull_run(tier, proj):
        return run([hull, "run", "--tier", tier, "--project", proj, "--", true], env=env)

    # A project used before, with no .hull of its own (a git checkout).
    used = tempfile.mkdtemp(prefix="hull-bench-used-")
    os.makedirs(os.path.join(used, ".git"))

    paired("bwrap",
           lambda: hull_run("bwrap", project),
           lambda: run(bare, env=env),
           args.rounds)
    paired("bwrap fresh",
           lambda: hull_run("bwrap", fresh()),
           lambda: run(bare, env=env),
           args.rounds)
    paired("landlock",
           lambda: hull_run("landlock", project),
           lambda: run([true], env=env, cwd=project),
           args.rounds)
    paired("landlock used",
           lambda: hull_run("landlock", used),
           lambda: run([true], env=env, cwd=used),
           args.rounds)
    paired("landlock fresh",
           lambda: hull_run("landlock", fresh()),
           lambda: run([true], env=env, cwd=project),
           args.rounds)

if __name__ == "__main__":
    main()
