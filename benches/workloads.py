#!/usr/bin/env python3
"""Real workloads per tier against native, paired in one run.

The workloads of tests/tests/workloads.rs, with the same scripts and the
same policies (the default profile plus each workload's grants):

  zlib    a Debian source package: ./configure --static, make -j$(nproc),
          make test
  idna    a Python package's own unittest suite (6256 tests)
  esbuild npm rebuild (esbuild's postinstall), then a bundle and node
  rust    cargo build --offline of a crate with a C build script

Each round runs every workload once on every tier, interleaved (so that
machine noise falls evenly), each in a fresh copy of its sources; the copy
is not timed. Reports median, min and max wall time and the ratio of the
median to native. Tier 3 runs under TCG on a host without usable KVM (`hull
probe` says which); its KVM estimate is native x 1.15 (an assumed cost of
virtiofs and a virtual CPU under KVM, not measured here) plus the wall time
of an empty tier-3 run measured here under TCG (restore and exit: an upper
bound for the same under KVM).

The sources come from the tests' cache (~/.cache/hull-tests/workloads):
run `cargo nextest run -p hull-tests -E 'binary(workloads)'` once first.

Usage: benches/workloads.py [--hull PATH] [--rounds N] [--tiers native,landlock,bwrap,vm]
                            [--only zlib,idna,esbuild,rust]
"""
import argparse, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                     "hull-tests", "workloads")
SYSTEM_PATH = "/usr/bin:/bin"


def rust_homes():
    rustup = os.environ.get("RUSTUP_HOME") or os.path.expanduser("~/.rustup")
    cargo = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    return rustup, cargo


def workloads():
    rustup, cargo = rust_homes()
    cbin = os.path.join(cargo, "bin")
    vendor = sorted(d for d in os.listdir(CACHE) if d.startswith("c-build-crate-vendor-")
                    and not d.endswith(".lock")) if os.path.isdir(CACHE) else []
    return {
        "zlib": dict(
            trees=[("zlib-bookworm", "")],
            script="./configure --static >build.log 2>&1 && make -j\"$(nproc)\" >>build.log 2>&1 "
                   "&& make test >test.log 2>&1; rc=$?; grep 'zlib.*test OK' test.log; exit $rc",
            expect="\t\t*** zlib test OK ***\n\t\t*** zlib 64-bit test OK ***\n",
            env={}, pass_=[], read_exec=[], userland=False),
        "idna": dict(
            trees=[("idna-3.7", "")],
            script="python3 -m unittest discover -s tests -t . 2>test.log; rc=$?; "
                   "sed -n 's/^\\(Ran [0-9]* tests\\) in .*/\\1/p; /^OK/p' test.log; exit $rc",
            expect="Ran 6256 tests\nOK\n",
            env={}, pass_=[], read_exec=[], userland=False),
        "esbuild": dict(
            trees=[("node-esbuild-0.19.12", "")],
            script="npm rebuild --foreground-scripts >rebuild.log 2>&1 && "
                   "./node_modules/.bin/esbuild src/app.js --bundle --platform=node "
                   "--log-level=warning --outfile=dist/app.js && node dist/app.js",
            expect="hello hull from a bundle\n",
            env={}, pass_=[], read_exec=[], userland=True),
        "rust": dict(
            trees=[(None, os.path.join(ROOT, "tests/fixtures/c-build-crate"))]
                  + [(v, "vendor") for v in vendor[-1:]],
            script="cargo build --offline -q && ./target/debug/cbuild",
            expect="hello from C: 42\n",
            env={"RUSTUP_HOME": rustup, "CARGO_HOME": "${TMP}/cargo",
                 "PATH": f"{cbin}:{SYSTEM_PATH}"},
            pass_=["RUSTUP_TOOLCHAIN"], read_exec=[rustup, cbin], userland=False),
    }


def policy(w):
    """The default profile with the workload's additions (as the tests make it)."""
    text = open(os.path.join(ROOT, "policies/default.toml")).read()
    text = text.replace("read_exec = [", "read_exec = [" + "".join(f'"{d}", ' for d in w["read_exec"]))
    text = text.replace("pass = [", "pass = [" + "".join(f'"{p}", ' for p in w["pass_"]))
    text = text.replace('memory = "4GiB"', 'memory = "2GiB"')
    env = dict(w["env"])
    env.setdefault("PATH", SYSTEM_PATH)
    text += "\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    if w["userland"]:
        u = open(os.path.join(ROOT, "tests/fixtures/vm-userland.toml")).read()
        text += "\n" + u[u.index("\n[vm]") + 1:]
    return text, env


def project(w, dest):
    """A fresh copy of the workload's sources in dest."""
    os.makedirs(dest)
    for name, sub in w["trees"]:
        src = os.path.join(CACHE, name) if name else sub
        to = os.path.join(dest, sub) if name else dest
        if not os.path.isdir(src):
            sys.exit(f"{src} is missing: run the workload tests once first "
                     "(cargo nextest run -p hull-tests -E 'binary(workloads)')")
        os.makedirs(to, exist_ok=True)
        subprocess.run(["cp", "-a", src + "/.", to], check=True)


def run_once(hull, tier, w, pol, env, scratch):
    proj = os.path.join(scratch, "p")
    if os.path.exists(proj):
        shutil.rmtree(proj)
    project(w, proj)
    if tier == "native":
        tmp = os.path.join(scratch, "tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        e = {k: os.environ[k] for k in ["LANG", "LC_ALL", "TERM", "TZ", "USER", "LOGNAME"]
             + w["pass_"] if k in os.environ}
        e.update(HOME=tmp, TMPDIR=tmp)
        e.update({k: v.replace("${TMP}", tmp) for k, v in env.items()})
        argv, kw = ["timeout", "600", "sh", "-c", w["script"]], dict(cwd=proj, env=e)
    else:
        argv = [hull, "run", "--tier", tier, "--policy", pol, "--project", proj,
                "--timeout", "600s", "--", "sh", "-c", w["script"]]
        kw = {}
    t = time.perf_counter()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, **kw)
    dt = time.perf_counter() - t
    if r.returncode != 0 or r.stdout.decode() != w["expect"]:
        sys.exit(f"{tier}: exit {r.returncode}\n{r.stdout.decode()}\n{r.stderr.decode()[-3000:]}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/debug/hull")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiers", default="native,landlock,bwrap,vm")
    ap.add_argument("--only", default="zlib,idna,esbuild,rust")
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    tiers = a.tiers.split(",")
    wls = {k: v for k, v in workloads().items() if k in a.only.split(",")}
    scratch = tempfile.mkdtemp(prefix="hull-bench-workloads-")
    pols = {}
    for name, w in wls.items():
        text, env = policy(w)
        path = os.path.join(scratch, f"{name}.toml")
        open(path, "w").write(text)
        pols[name] = (path, env)
    times = {(n, t): [] for n in wls for t in tiers}
    empty = []
    if "vm" in tiers:
        os.makedirs(os.path.join(scratch, "empty"))
    for rnd in range(a.rounds):
        for name, w in wls.items():
            for tier in tiers:
                dt = run_once(hull, tier, w, pols[name][0], pols[name][1], scratch)
                times[(name, tier)].append(dt)
                print(f"round {rnd + 1}: {name:8} {tier:8} {dt:7.2f} s", file=sys.stderr, flush=True)
        if "vm" in tiers:
            t = time.perf_counter()
            r = subprocess.run([hull, "run", "--tier", "vm", "--project", os.path.join(scratch, "empty"),
                                "--timeout", "120s", "--", "true"], stdin=subprocess.DEVNULL,
                               capture_output=True)
            if r.returncode != 0:
                sys.exit(f"empty vm run: {r.stderr.decode()}")
            empty.append(time.perf_counter() - t)
    print(f"| workload | tier | median | min | max | x native |")
    print(f"|---|---|---|---|---|---|")
    for name in wls:
        base = statistics.median(times[(name, tiers[0])])
        for tier in tiers:
            ts = times[(name, tier)]
            med = statistics.median(ts)
            print(f"| {name} | {tier} | {med:.2f} s | {min(ts):.2f} | {max(ts):.2f} | {med / base:.1f}x |")
    if "vm" in tiers and "native" in tiers:
        restore = statistics.median(empty)
        print(f"\nvm (TCG): an empty run (`true`) takes {restore:.2f} s median here (restore and exit).")
        for name in wls:
            est = statistics.median(times[(name, "native")]) * 1.15 + restore
            print(f"  {name}: KVM estimate at most {est:.1f} s (native x 1.15 + {restore:.2f} s)")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
