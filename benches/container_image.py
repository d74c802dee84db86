#!/usr/bin/env python3
"""A container image as tier 3's userland: what its first use costs (read
and flatten, `hull image import`, into an empty cache) per form, what a
later import costs (nothing read), and a run on it paired against a run
on the same userland given as `[vm] rootfs` (they share the prepared
snapshot: the image's flattened tarball is the rootfs when the image is
one layer of it). On bwrap: the first run on an image (import, flatten
and unpack into an empty cache, then the run), and later runs on it paired
against plain bwrap runs on the host's userland. With --registry, the
same on bwrap from a registry (Debian's docker-registry, started on
loopback): the first run (pull through the policy's allowlist, flatten,
unpack, run) and later runs (the tag's manifest asked for again, found
imported) paired against later runs on the OCI archive under the same
policy.

Usage: benches/container_image.py --hull PATH --rootfs TAR [--rounds N] [--bwrap-only] [--registry]
"""
import argparse, os, shutil, socket, statistics, subprocess, tempfile, time

MAKE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "container-image", "make.py")


def timed(argv, env=None):
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, timeout=600, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}):\n{r.stderr.decode()}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hull", default="target/release/hull")
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bwrap-only", action="store_true")
    ap.add_argument("--registry", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hull-bench-image-")
    refs = {}
    for kind, name in [("oci-archive", "image.oci.tar"), ("docker-archive", "image.docker.tar"),
                       ("oci-layout", "layout")]:
        out = os.path.join(work, name)
        subprocess.run(["python3", MAKE, kind, out, args.rootfs], check=True)
        refs[kind] = {"oci-layout": f"oci:{out}:latest"}.get(kind, f"{kind}:{out}")
    size = os.path.getsize(args.rootfs) / 2**20
    print(f"one layer of {size:.0f} MiB (uncompressed; gzip'd in the OCI forms)")
    bwrap(args, refs, work)
    if args.registry:
        registry(args, refs, work)
    if args.bwrap_only:
        shutil.rmtree(work)
        return
    for kind, ref in refs.items():
        cache = os.path.join(work, "cache-" + kind)
        env = dict(os.environ, HULL_IMAGE_CACHE=cache)
        first = timed([args.hull, "image", "import", ref], env)
        later = statistics.median(timed([args.hull, "image", "import", ref], env) for _ in range(5))
        print(f"{kind:15} first import {first:6.2f} s   later {later * 1000:6.1f} ms")
        shutil.rmtree(cache)
    project = tempfile.mkdtemp(prefix="hull-bench-image-project-")
    policy = os.path.join(work, "rootfs.toml")
    with open(policy, "w") as f:
        f.write(f'version = 1\n[fs]\nread_write = ["${{PROJECT}}"]\n[vm]\nrootfs = "{args.rootfs}"\n')
    run = [args.hull, "run", "--tier3", "--timeout", "120s", "--project", project]
    # Once each first: the import and any preparation are not measured.
    # The same policy for both (its [vm] is replaced by --image): the same
    # shares, the same start.
    timed(run + ["--policy", policy, "--image", refs["oci-archive"], "--", "true"])
    timed(run + ["--policy", policy, "--", "true"])
    image, rootfs = [], []
    for i in range(args.rounds):
        pair = [(image, ["--policy", policy, "--image", refs["oci-archive"]]),
                (rootfs, ["--policy", policy])]
        for acc, extra in (pair if i % 2 == 0 else pair[::-1]):
            acc.append(timed(run + extra + ["--", "true"]))
    print(f"run --image (oci-archive) p50 {statistics.median(image):.2f} s   "
          f"run [vm] rootfs p50 {statistics.median(rootfs):.2f} s   ({args.rounds} pairs)")
    shutil.rmtree(work)


def bwrap(args, refs, work):
    cache = os.path.join(work, "cache-bwrap")
    env = dict(os.environ, HULL_IMAGE_CACHE=cache)
    project = tempfile.mkdtemp(prefix="hull-bench-image-bwrap-")
    run = [args.hull, "run", "--tier", "bwrap", "--timeout", "120s", "--project", project]
    for kind in ("oci-archive", "docker-archive"):
        first = timed(run + ["--image", refs[kind], "--", "true"], env)
        print(f"bwrap {kind:15} first run (import, flatten, unpack, run) {first:6.2f} s")
        shutil.rmtree(cache)
    timed(run + ["--image", refs["oci-archive"], "--", "true"], env)
    rounds = max(args.rounds, 20)
    image, host = [], []
    for i in range(rounds):
        pair = [(image, ["--image", refs["oci-archive"]]), (host, [])]
        for acc, extra in (pair if i % 2 == 0 else pair[::-1]):
            acc.append(timed(run + extra + ["--", "true"], env))
    print(f"bwrap run --image p50 {statistics.median(image) * 1000:.1f} ms   "
          f"bwrap run on the host's userland p50 {statistics.median(host) * 1000:.1f} ms   "
          f"({rounds} pairs)")
    shutil.rmtree(cache)
    shutil.rmtree(project)


def registry(args, refs, work):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = os.path.join(work, "registry-data")
    config = os.path.join(work, "registry.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {data}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    reg = subprocess.Popen(["/usr/bin/docker-registry", "serve", config],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        subprocess.run(["python3", MAKE, "push", f"127.0.0.1:{port}", "bench/image", args.rootfs],
                       check=True, capture_output=True)
        policy = os.path.join(work, "pull.toml")
        with open(policy, "w") as f:
            f.write(f'version = 1\n[fs]\nread_write = ["${{PROJECT}}"]\n[net]\nmode = "allowlist"\n'
                    f'allow = ["127.0.0.1"]\nports = [{port}]\nallow_private = ["127.0.0.1/32"]\n')
        cache = os.path.join(work, "cache-registry")
        env = dict(os.environ, HULL_IMAGE_CACHE=cache)
        project = tempfile.mkdtemp(prefix="hull-bench-image-registry-")
        run = [args.hull, "run", "--tier", "bwrap", "--timeout", "120s", "--project", project,
               "--policy", policy]
        pulled = f"docker://127.0.0.1:{port}/bench/image:plain"
        first = timed(run + ["--image", pulled, "--", "true"], env)
        print(f"bwrap docker://        first run (pull, flatten, unpack, run) {first:6.2f} s")
        timed(run + ["--image", refs["oci-archive"], "--", "true"], env)
        rounds = max(args.rounds, 20)
        by_tag, archive = [], []
        for i in range(rounds):
            pair = [(by_tag, ["--image", pulled]), (archive, ["--image", refs["oci-archive"]])]
            for acc, extra in (pair if i % 2 == 0 else pair[::-1]):
                acc.append(timed(run + extra + ["--", "true"], env))
        print(f"bwrap run --image docker://...:TAG p50 {statistics.median(by_tag) * 1000:.1f} ms   "
              f"--image oci-archive: p50 {statistics.median(archive) * 1000:.1f} ms   "
              f"({rounds} pairs, the same policy)")
        shutil.rmtree(cache)
        shutil.rmtree(project)
    finally:
        reg.kill()
        reg.wait()


if __name__ == "__main__":
    main()
