#!/usr/bin/env python3
"""`hull batch` with JSON jobs: N `true` jobs on a tier, jobs per second and
the per-job wall, with workspace "shared" and "cow" (a pristine project per
job, its writes kept as a change set), on a project of F files.

  jobs/s:  N jobs over the batch's wall time (--parallel P)
  job p50: the median of the results' wall_s (one `hull run` each)

The project is F files of 100 bytes in 100 directories, made once (not
timed). Each mode runs into a fresh --out and change-set store; the modes
are interleaved round by round.

On vm a third mode, `pool`, runs the same jobs as shell lines through the
older warm pool (`hull batch --pool P`, no --tier: a VM restored ahead of
each job in-process), for the comparison.

Usage: benches/batch.py [--hull PATH] [--tier bwrap|vm] [--jobs N]
                        [--parallel P] [--files F] [--rounds R]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/debug/hull")
    ap.add_argument("--tier", default="bwrap")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    scratch = tempfile.mkdtemp(prefix="hull-bench-batch-")
    proj = os.path.join(scratch, "project")
    for i in range(a.files):
        d = os.path.join(proj, f"d{i % 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "w") as f:
            f.write("%0100d" % i)
    modes = ("shared", "cow", "pool") if a.tier == "vm" else ("shared", "cow")
    stats = {m: [] for m in modes}
    for r in range(a.rounds):
        for ws in modes:
            if ws == "pool":
                stats[ws].append(pool_round(a, hull, scratch, proj, r))
                continue
            jobs = os.path.join(scratch, f"jobs-{ws}.jsonl")
            with open(jobs, "w") as f:
                for i in range(a.jobs):
                    f.write(json.dumps({"id": f"j{i}", "argv": ["true"], "workspace": ws}) + "\n")
            out = os.path.join(scratch, f"out-{ws}-{r}")
            env = dict(os.environ, HULL_CHANGES_DIR=os.path.join(scratch, f"changes-{ws}-{r}"))
            t = time.perf_counter()
            p = subprocess.run([hull, "batch", jobs, "--tier", a.tier, "--project", proj,
                                "--out", out, "--parallel", str(a.parallel)],
                               env=env, stdin=subprocess.DEVNULL, capture_output=True)
            wall = time.perf_counter() - t
            if p.returncode != 0:
                failed = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))
                          if json.loads(l).get("exit_code") != 0]
                why = "\n".join(f"{r['id']}: {r.get('error')} {open(r['stderr']).read()[-500:]}"
                                for r in failed[:3])
                sys.exit(f"batch {ws}: exit {p.returncode}\n{p.stderr.decode()[-2000:]}\n{why}")
            walls = [json.loads(l)["wall_s"] for l in open(os.path.join(out, "results.jsonl"))]
            assert len(walls) == a.jobs
            stats[ws].append((a.jobs / wall, statistics.median(walls), wall / a.jobs))
            shutil.rmtree(out)
            shutil.rmtree(env["HULL_CHANGES_DIR"], ignore_errors=True)
    print(f"| {a.jobs} `true` jobs on {a.tier}, --parallel {a.parallel}, {a.files} files "
          f"| jobs/s | job p50 | wall per job |")
    print("|---|---|---|---|")
    for ws, rows in stats.items():
        med = lambda k: statistics.median(x[k] for x in rows)
        print(f"| {ws} | {med(0):.1f} | {med(1) * 1000:.0f} ms | {med(2) * 1000:.0f} ms |")
    ratio = statistics.median(x[1] for x in stats["cow"]) / statistics.median(x[1] for x in stats["shared"])
    print(f"cow/shared job p50: {ratio:.2f}")
    shutil.rmtree(scratch, ignore_errors=True)


def pool_round(a, hull, scratch, proj, r):
    """One batch of `true` shell lines through the warm pool (`--json`
    prints each job's report: job_s from taking the job, its VM restored)."""
    jobs = os.path.join(scratch, "jobs-pool.txt")
    with open(jobs, "w") as f:
        f.write("true\n" * a.jobs)
    out = os.path.join(scratch, f"out-pool-{r}")
    t = time.perf_counter()
    p = subprocess.run([hull, "batch", "--pool", str(a.parallel), "--project", proj,
                        "--out", out, "--json", jobs],
                       stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"batch pool: exit {p.returncode}\n{p.stderr.decode()[-2000:]}")
    reports = [json.loads(l) for l in p.stdout.decode().splitlines() if l.startswith("{")]
    assert len(reports) == a.jobs, len(reports)
    shutil.rmtree(out, ignore_errors=True)
    # A pool job's time excludes its VM's restore; the wall includes it.
    return (a.jobs / wall, statistics.median(r["job_s"] + r["restore_s"] for r in reports),
            wall / a.jobs)


if __name__ == "__main__":
    main()
