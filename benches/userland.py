#!/usr/bin/env python3
"""A `[vm] packages` userland against the default one, measured side by side.

  build:   the userland image's build (seconds per step, from its manifest)
           and its size (container rootfs, disk allocated, whole directory)
           against the default image's.
  restore: `hull run --tier vm -- true` wall time with the default policy
           and with the userland's policy, interleaved round by round so
           that machine noise falls evenly; median, min and max.

Both images must be built (`hull image build`, and `hull image build
--policy POLICY`). TCG emulation on a host without usable KVM unless
`hull probe` says otherwise.

Usage: benches/userland.py [--hull PATH] [--policy POLICY] [--rounds N]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time


def run(argv, **kw):
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kw)


def images(hull):
    """id -> manifest of the images this hull uses ("built (current)")."""
    root = os.environ.get("HULL_IMAGE_CACHE") or os.path.expanduser("~/.cache/hull/images")
    out = {}
    listing = run([hull, "image", "list"]).stdout.decode()
    for line in listing.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 2 and parts[1] == "built" and parts[2] == "(current)":
            d = os.path.join(root, parts[0])
            m = json.load(open(os.path.join(d, "manifest.json")))
            m["_dir"] = d
            out[parts[0]] = m
    return out


def du(path):
    """Bytes allocated (the disk is sparse)."""
    return int(run(["du", "-s", "--block-size=1", path]).stdout.split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/debug/hull")
    ap.add_argument("--policy", default="tests/fixtures/vm-userland.toml")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    hull = os.path.abspath(a.hull)
    policy = os.path.abspath(a.policy)
    imgs = images(hull)
    default = [m for m in imgs.values() if not m.get("packages") and not m.get("rootfs")]
    userland = [m for m in imgs.values() if m.get("packages")]
    if not default or not userland:
        sys.exit("build both images first: `hull image build` and `hull image build --policy "
                 f"{a.policy}`")
    print("== build ==")
    for name, m in [("default", default[0]), ("userland", userland[0])]:
        info = m["info"]
        print(f"{name:9} {m['id']}  packages: {' '.join(m.get('packages', [])) or '-'}")
        print(f"          build {m['build_seconds']:.0f} s: " + ", ".join(
            f"{s['name'].split(' (')[0]} {s['seconds']:.0f} s" for s in m["steps"]))
        print(f"          container rootfs {int(info['container_rootfs_bytes']) / 2**20:.0f} MiB "
              f"(zstd), disk allocated {int(info['disk_allocated_bytes']) / 2**20:.0f} MiB, "
              f"directory {du(m['_dir']) / 2**20:.0f} MiB")
    print("\n== restore: hull run --tier vm -- true ==")
    project = tempfile.mkdtemp(prefix="hull-bench-userland-")
    # The same shares both ways; only the userland differs.
    fs = 'version = 1\n[fs]\nread_write = ["${PROJECT}"]\n'
    vm = open(policy).read().split("\n[vm]\n", 1)[1]
    plain, with_vm = os.path.join(project, "..", "plain.toml"), os.path.join(project, "..", "vm.toml")
    with open(plain, "w") as f:
        f.write(fs)
    with open(with_vm, "w") as f:
        f.write(fs + "[vm]\n" + vm)
    runs = [("default", ["--policy", plain]), ("userland", ["--policy", with_vm])]
    times = {"default": [], "userland": []}
    for label, args in runs:
        r = run([hull, "run", "--tier", "vm", "--project", project] + args + ["--", "true"])
        if r.returncode != 0:
            sys.exit(f"{label}: warm-up failed:\n{r.stderr.decode()}")
    for _ in range(a.rounds):
        for label, args in runs:
            t = time.perf_counter()
            r = run([hull, "run", "--tier", "vm", "--project", project] + args + ["--", "true"])
            dt = time.perf_counter() - t
            if r.returncode != 0:
                sys.exit(f"{label}: run failed:\n{r.stderr.decode()}")
            times[label].append(dt)
    for label, ts in times.items():
        print(f"{label:9} median {statistics.median(ts):.2f} s  min {min(ts):.2f}  max {max(ts):.2f}"
              f"  ({len(ts)} runs)")
    print(f"ratio userland/default: {statistics.median(times['userland']) / statistics.median(times['default']):.2f}")


if __name__ == "__main__":
    main()
