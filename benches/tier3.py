#!/usr/bin/env python3
"""Tier-3 benchmarks, measured side by side in one run.

  cold:  `hull run --tier3 -- true` (hull start to exit, fresh VM) against
         bare QEMU booting the same kernel, initrd and disk (copy-on-write)
         until the guest prints its "starting hull-agent outer" milestone.
  warm:  `hull run --tier3 --vm NAME -- true` p50, with NAME kept up by
         `hull vm up` (VM and container already running).
  fs:    inside a warm VM's container: sequential read of a 64 MiB file in
         the project share and 500 small-file creates, against the same on
         the host.

Figures are TCG emulation on a host without usable KVM unless `hull probe`
says otherwise. Usage: benches/tier3.py [--rounds N] [--hull PATH]
"""
import argparse, glob, json, os, shutil, statistics, subprocess, sys, tempfile, time


def hull_cmd(hull, args, cwd, env):
    return subprocess.run([hull] + args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def must(r, what):
    if r.returncode != 0:
        sys.exit(f"{what} failed ({r.returncode}):\n{r.stdout.decode()}\n{r.stderr.decode()}")
    return r


def image_dir():
    root = os.environ.get("HULL_IMAGE_CACHE") or os.path.expanduser("~/.cache/hull/images")
    dirs = [d for d in glob.glob(os.path.join(root, "*"))
            if os.path.isfile(os.path.join(d, "manifest.json")) and ".partial" not in d]
    if not dirs:
        sys.exit(f"no built image under {root}: run `hull image build` first")
    return max(dirs, key=lambda d: os.path.getmtime(os.path.join(d, "manifest.json")))


def bare_boot(img, accel, workdir):
    """Seconds from QEMU start to the guest's agent-start milestone."""
    console = os.path.join(workdir, "bare-console.log")
    open(console, "w").close()
    argv = ["qemu-system-x86_64", "-accel", accel, "-M", "pc", "-nodefaults", "-no-user-config",
            "-display", "none", "-no-reboot", "-nic", "none", "-m", "2048", "-smp", "2",
            "-cpu", "max" if accel == "tcg" else "host",
            "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
            "-kernel", os.path.join(img, "vmlinux"), "-initrd", os.path.join(img, "initrd.cpio"),
            "-append", "console=ttyS0 quiet panic=-1 root=/dev/vda",
            "-drive", f"file={os.path.join(img, 'disk.raw')},if=none,id=d0,format=raw,snapshot=on",
            "-device", "virtio-blk-pci,drive=d0", "-serial", f"file:{console}"]
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, TMPDIR=workdir))
    try:
        while True:
            with open(console, errors="replace") as f:
                if "starting hull-agent outer" in f.read():
                    return time.perf_counter() - t
            if p.poll() is not None:
                sys.exit("bare QEMU exited before the milestone; see " + console)
            if time.perf_counter() - t > 600:
                sys.exit("bare QEMU boot took longer than 600 s")
            time.sleep(0.05)
    finally:
        p.kill()
        p.wait()


def med(xs):
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3, help="cold rounds (each boots a VM)")
    ap.add_argument("--warm-rounds", type=int, default=20)
    ap.add_argument("--hull", default=shutil.which("hull") or "target/release/hull")
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    work = tempfile.mkdtemp(prefix="h3b-", dir="/tmp")
    proj = os.path.join(work, "p")
    os.makedirs(proj)
    env = dict(os.environ, HULL_RUNS_DIR=os.path.join(work, "r"), HULL_VMS_DIR=os.path.join(work, "v"))
    probe = json.loads(must(hull_cmd(hull, ["probe", "--json"], proj, env), "hull probe").stdout)
    vm = next(p for p in probe if p["tier"] == "vm")
    if not vm["available"]:
        sys.exit("tier 3 unavailable: " + vm["reason"])
    accel = "kvm" if "accelerator kvm" in vm["reason"] else "tcg"
    img = image_dir()
    print(f"accelerator: {accel}; image {img}")

    cold_hull, cold_bare = [], []
    for i in range(a.rounds):
        cold_hull.append(timed(lambda: must(hull_cmd(hull, ["run", "--tier3", "--", "true"], proj, env), "hull run --tier3")))
        cold_bare.append(bare_boot(img, accel, work))
    print(f"cold  hull run --tier3 -- true     p50 {med(cold_hull):7.2f} s  ({', '.join(f'{x:.1f}' for x in cold_hull)})")
    print(f"cold  bare QEMU to agent start     p50 {med(cold_bare):7.2f} s  ({', '.join(f'{x:.1f}' for x in cold_bare)})")

    name = "bench"
    must(hull_cmd(hull, ["vm", "up", "--name", name, "--idle", "30m"], proj, env), "hull vm up")
    try:
        warm = [timed(lambda: must(hull_cmd(hull, ["run", "--tier3", "--vm", name, "--", "true"], proj, env), "warm run"))
                for _ in range(a.warm_rounds)]
        print(f"warm  hull run --tier3 --vm -- true p50 {med(warm) * 1000:7.1f} ms")
        with open(os.path.join(proj, "big"), "wb") as f:
            f.write(os.urandom(64 << 20))
        script = ("s=$(date +%s%N); cat big > /dev/null; e=$(date +%s%N); echo read $((e-s)); "
                  "mkdir -p many; s=$(date +%s%N); i=0; while [ $i -lt 500 ]; do : > many/f$i; i=$((i+1)); done; "
                  "e=$(date +%s%N); echo create $((e-s)); rm -rf many")
        out = must(hull_cmd(hull, ["run", "--tier3", "--vm", name, "--", "sh", "-c", script], proj, env), "fs run").stdout.decode()
        host = must(subprocess.run(["sh", "-c", script], cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.PIPE), "host fs").stdout.decode()
        vals = lambda t: {k: int(v) for k, v in (l.split() for l in t.split("\n") if l.strip())}
        g, h = vals(out), vals(host)
        print(f"fs    64 MiB sequential read  vm {64 / (g['read'] / 1e9):7.1f} MB/s   host {64 / (h['read'] / 1e9):7.1f} MB/s")
        print(f"fs    small-file create       vm {g['create'] / 500 / 1e6:7.2f} ms   host {h['create'] / 500 / 1e6:7.3f} ms")
    finally:
        hull_cmd(hull, ["vm", "down", "--name", name], proj, env)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
