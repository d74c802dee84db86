#!/usr/bin/env python3
"""Tier-3 benchmarks, measured side by side in one run.

  restore: `hull run --tier3 -- echo x` with the image's prepared snapshot
           (the default): hull start to first output byte, and to exit.
  boot:    the same with HULL_VM_SNAPSHOT=off (the guest boots), against bare
           QEMU booting the same kernel, initrd and disk to init
           (`hull-init: ... mounts done`) and to the agent start milestone.
  warm:    `hull run --tier3 --vm NAME -- true` p50, NAME kept up by
           `hull vm up` (VM and container already running), against
           `incus exec hull-run -- true` in the same guest image (booted in
           its debug mode, timed by the guest shell).
  pool:    `hull batch --pool 2` of `true` jobs: seconds per job from taking
           the job (VM restored ahead) to its VM's end, p50.
  rss:     QEMU's resident memory for the idle `hull vm up` VM.
  fs:      inside the warm VM's container: sequential read of a 64 MiB file
           in the project share and 500 small-file creates, against the host.

Figures are TCG emulation on a host without usable KVM unless `hull probe`
says otherwise. Usage: benches/tier3.py [--rounds N] [--boot-rounds N] [--hull PATH]
[--against PATH [--against-agent PATH]]
"""
import argparse, glob, json, os, re, shutil, statistics, subprocess, sys, tempfile, time


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
    # The default userland's image (a policy's [vm] packages make others).
    dirs = [d for d in glob.glob(os.path.join(root, "*"))
            if os.path.isfile(os.path.join(d, "manifest.json")) and ".partial" not in d
            and not json.load(open(os.path.join(d, "manifest.json"))).get("packages")]
    if not dirs:
        sys.exit(f"no built image under {root}: run `hull image build` first")
    return max(dirs, key=lambda d: os.path.getmtime(os.path.join(d, "manifest.json")))


def bare_argv(img, accel, serial, cmdline_extra=""):
    """QEMU booting the image's kernel, initrd and disk (copy-on-write), no NIC."""
    return ["qemu-system-x86_64", "-accel", accel, "-M", "pc", "-nodefaults", "-no-user-config",
            "-display", "none", "-no-reboot", "-nic", "none", "-m", "2048", "-smp", "2",
            "-cpu", "max" if accel == "tcg" else "host",
            "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
            "-kernel", os.path.join(img, "vmlinux"), "-initrd", os.path.join(img, "initrd.cpio"),
            "-append", ("console=ttyS0 quiet panic=-1 root=/dev/vda " + cmdline_extra).strip(),
            "-drive", f"file={os.path.join(img, 'disk.raw')},if=none,id=d0,format=raw,snapshot=on",
            "-device", "virtio-blk-pci,drive=d0",
            # The guest's init mounts hull's agent disk (/dev/vdb) before it goes on.
            "-drive", f"file={agent_disk(img)},if=none,id=d1,format=raw,readonly=on",
            "-device", "virtio-blk-pci,drive=d1", "-serial", serial]


def agent_disk(img):
    """The image's newest agent disk (`agent-<hash>.ext4`, made by its first run)."""
    disks = glob.glob(os.path.join(img, "agent-*.ext4"))
    if not disks:
        sys.exit(f"no agent disk in {img}: run `hull run --tier3 -- true` once first")
    return max(disks, key=os.path.getmtime)


def bare_until(img, accel, workdir, milestone):
    """Seconds from QEMU start until the console shows `milestone`."""
    console = os.path.join(workdir, "bare-console.log")
    open(console, "w").close()
    argv = bare_argv(img, accel, f"file:{console}")
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, TMPDIR=workdir))
    try:
        while True:
            with open(console, errors="replace") as f:
                if milestone in f.read():
                    return time.perf_counter() - t
            if p.poll() is not None or time.perf_counter() - t > 600:
                sys.exit(f"bare QEMU did not reach {milestone!r}; see {console}")
            time.sleep(0.02)
    finally:
        p.kill()
        p.wait()


def bare_boot(img, accel, workdir):
    """To the guest's agent-start milestone (incusd socket up)."""
    return bare_until(img, accel, workdir, "starting hull-agent outer")


def bare_init(img, accel, workdir):
    """To init's first milestone (`mounts done`)."""
    return bare_until(img, accel, workdir, "mounts done")


def first_byte(hull, args, cwd, env):
    """(seconds to the first stdout byte, seconds to exit)."""
    t = time.perf_counter()
    p = subprocess.Popen([hull] + args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)
    t1 = time.perf_counter() - t
    rest, err = p.communicate()
    t2 = time.perf_counter() - t
    if p.returncode != 0 or not first:
        sys.exit(f"{args} failed ({p.returncode}): {err.decode()}")
    return t1, t2


def incus_exec(img, accel, workdir, rounds):
    """`incus exec hull-run -- true` timed by the guest shell (debug boot)."""
    import socket
    sock = os.path.join(workdir, "dbg.sock")
    argv = bare_argv(img, accel, f"unix:{sock},server=on,wait=off", "hull.mode=debug")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, TMPDIR=workdir))
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.settimeout(1)
        buf = b""
        def until(needle, limit=600):
            nonlocal buf
            end = time.time() + limit
            while re.search(needle, buf) is None:
                if time.time() > end:
                    sys.exit(f"debug guest: no {needle!r}; got {buf[-500:]!r}")
                try:
                    buf += s.recv(65536)
                except socket.timeout:
                    pass
        until(rb"debug shell on ttyS0")
        time.sleep(1)
        ctl = "/run/hull/ctl/hull-run"
        cmd = (f"incus admin waitready --timeout=300; mkdir -p {ctl}; "
               f"chown $(incus config get hull-run volatile.idmap.next | tr '{{' '\\n' | grep '\"Nsid\":0,' | grep Isuid | sed 's/.*Hostid.:\\([0-9]*\\).*/\\1/' | head -n1) {ctl}; "
               "incus start hull-run >/dev/null 2>&1 || incus start hull-run; echo STARTED-$?\n")
        s.sendall(cmd.encode())
        until(rb"STARTED-\d")
        times = []
        for i in range(rounds):
            buf = b""
            s.sendall(b"a=$(date +%s%N); incus exec hull-run -- true; b=$(date +%s%N); echo IX=$((b-a))=\n")
            m = None
            end = time.time() + 120
            while m is None and time.time() < end:
                m = re.search(rb"IX=(\d+)=", buf)
                if m is None:
                    try:
                        buf += s.recv(65536)
                    except socket.timeout:
                        pass
            if m is None:
                sys.exit(f"debug guest: no timing; got {buf[-500:]!r}")
            times.append(int(m.group(1)) / 1e9)
        return times
    finally:
        p.kill()
        p.wait()


def qemu_rss(name):
    """VmRSS (MiB) of the QEMU whose -name starts with `name`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"qemu-system-x86_64") and any(a.startswith(name.encode()) for a in cmd):
            for l in open(f"/proc/{pid}/status"):
                if l.startswith("VmRSS:"):
                    return int(l.split()[1]) / 1024
    return None


def med(xs):
    return statistics.median(xs)


def policies(hull, proj, env, work, rounds):
    """Restore to first byte with the default profile, `--policy build` (8 GiB
    limit: its own snapshot size) and a policy of 10 read-only grants (13
    shares: packed into one view), rounds interleaved so load hits all alike."""
    grants = []
    for i in range(10):
        d = os.path.join(work, f"tool{i}")
        os.makedirs(d)
        grants.append(json.dumps(d))
    many = os.path.join(work, "many.toml")
    with open(many, "w") as f:
        f.write('version = 1\n[fs]\nread_exec = ["/usr", "/bin", "/lib", "/lib64"]\n'
                f'read = ["/etc", {", ".join(grants)}]\nread_write = ["${{PROJECT}}"]\n')
    kinds = {"default": [], "build": ["--policy", "build"], "many": ["--policy", many]}
    for k, extra in kinds.items():
        r = must(hull_cmd(hull, ["run", "--tier3", *extra, "--", "true"], proj, env), f"prepare {k}")
        if b"booting the guest instead" in r.stderr:
            sys.exit(f"{k}: booted instead of restoring: {r.stderr.decode()}")
    got = {k: [] for k in kinds}
    for _ in range(rounds):
        for k, extra in kinds.items():
            got[k].append(first_byte(hull, ["run", "--tier3", *extra, "--", "echo", "x"], proj, env))
    base = med([x[0] for x in got["default"]])
    for k in kinds:
        fb = [x[0] for x in got[k]]
        print(f"policy   {k:8} restore, first byte            p50 {med(fb):7.2f} s  "
              f"({', '.join(f'{x:.2f}' for x in fb)}); {med(fb) / base:.2f}x default")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="restore rounds")
    ap.add_argument("--boot-rounds", type=int, default=2, help="boot rounds (each boots a VM)")
    ap.add_argument("--pool-jobs", type=int, default=8)
    ap.add_argument("--incus-rounds", type=int, default=5)
    ap.add_argument("--warm-rounds", type=int, default=20)
    ap.add_argument("--hull", default=shutil.which("hull") or "target/release/hull")
    ap.add_argument("--against", metavar="HULL",
                    help="only restore to first byte and warm runs, paired: each round runs this other "
                         "hull build and then --hull (same image, agent and snapshot; warm: a kept VM each)")
    ap.add_argument("--against-agent", metavar="AGENT",
                    help="the hull-agent the --against build runs with (its own snapshot); "
                         "default: the same as --hull's (HULL_AGENT)")
    ap.add_argument("--policies-only", action="store_true",
                    help="only the restore of the default profile, `build` and a policy beyond the slots, paired")
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

    # Prepare the snapshot first (a no-op when `hull image build` made it).
    must(hull_cmd(hull, ["run", "--tier3", "--", "true"], proj, env), "hull run --tier3 (prepare)")
    if a.against:
        other = os.path.abspath(a.against)
        other_env = dict(env, HULL_AGENT=os.path.abspath(a.against_agent)) if a.against_agent else env
        envs = {other: other_env, hull: env}
        must(hull_cmd(other, ["run", "--tier3", "--", "true"], proj, other_env), "the other hull (prepare)")
        got = {other: [], hull: []}
        for _ in range(a.rounds):
            for h in (other, hull):
                got[h].append(first_byte(h, ["run", "--tier3", "--", "echo", "x"], proj, envs[h]))
        fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
        for h, what in ((other, "against"), (hull, "hull")):
            fb, ex = [x[0] for x in got[h]], [x[1] for x in got[h]]
            print(f"{what:8} {h}: first byte p50 {med(fb):5.2f} s ({fmt(fb)}); exit p50 {med(ex):5.2f} s")
        print(f"ratio    hull / against, first byte {med([x[0] for x in got[hull]]) / med([x[0] for x in got[other]]):.2f}")
        # Warm, paired: a kept VM of each build, their runs alternating.
        names = {other: "bench-against", hull: "bench-hull"}
        try:
            for h in (other, hull):
                must(hull_cmd(h, ["vm", "up", "--name", names[h], "--idle", "30m"], proj, envs[h]), f"{h} vm up")
            warm = {other: [], hull: []}
            for _ in range(a.warm_rounds):
                for h in (other, hull):
                    argv = ["run", "--tier3", "--vm", names[h], "--", "true"]
                    warm[h].append(timed(lambda: must(hull_cmd(h, argv, proj, envs[h]), "warm run")))
            for h, what in ((other, "against"), (hull, "hull")):
                print(f"{what:8} warm hull run --tier3 --vm -- true p50 {med(warm[h]) * 1000:6.1f} ms "
                      f"({min(warm[h]) * 1000:.0f}-{max(warm[h]) * 1000:.0f})")
            print(f"ratio    hull / against, warm {med(warm[hull]) / med(warm[other]):.2f}")
        finally:
            for h in (other, hull):
                hull_cmd(h, ["vm", "down", "--name", names[h]], proj, envs[h])
            shutil.rmtree(work, ignore_errors=True)
        return
    policies(hull, proj, env, work, a.rounds)
    if a.policies_only:
        shutil.rmtree(work, ignore_errors=True)
        return
    restore = [first_byte(hull, ["run", "--tier3", "--", "echo", "x"], proj, env) for _ in range(a.rounds)]
    boot_env = dict(env, HULL_VM_SNAPSHOT="off")
    boot = [first_byte(hull, ["run", "--tier3", "--", "echo", "x"], proj, boot_env) for _ in range(a.boot_rounds)]
    bare_i = [bare_init(img, accel, work) for _ in range(a.boot_rounds)]
    bare_a = [bare_boot(img, accel, work) for _ in range(a.boot_rounds)]
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    print(f"restore  hull run --tier3 -- echo x, first byte  p50 {med([x[0] for x in restore]):7.2f} s  ({fmt([x[0] for x in restore])})")
    print(f"restore  hull run --tier3 -- echo x, exit        p50 {med([x[1] for x in restore]):7.2f} s  ({fmt([x[1] for x in restore])})")
    print(f"boot     HULL_VM_SNAPSHOT=off, first byte        p50 {med([x[0] for x in boot]):7.2f} s  ({fmt([x[0] for x in boot])})")
    print(f"bare     QEMU to init (mounts done)              p50 {med(bare_i):7.2f} s  ({fmt(bare_i)})")
    print(f"bare     QEMU to agent start                     p50 {med(bare_a):7.2f} s  ({fmt(bare_a)})")
    r50 = med([x[0] for x in restore])
    print(f"ratio    boot / restore {med([x[0] for x in boot]) / r50:5.1f}x   bare-init / restore {med(bare_i) / r50:5.1f}x")

    jobs = os.path.join(work, "jobs.txt")
    with open(jobs, "w") as f:
        f.write("true\n" * a.pool_jobs)
    t = time.perf_counter()
    out = must(hull_cmd(hull, ["batch", "--pool", "2", "--json", "--out", os.path.join(work, "out"), jobs], proj, env), "hull batch").stdout.decode()
    wall = time.perf_counter() - t
    per = [json.loads(l)["job_s"] for l in out.splitlines() if l.strip()]
    print(f"pool     hull batch --pool 2, {a.pool_jobs} jobs: per job p50 {med(per):6.2f} s  ({fmt(per)}); wall {wall:.1f} s = {wall / a.pool_jobs:.2f} s/job")

    name = "bench"
    must(hull_cmd(hull, ["vm", "up", "--name", name, "--idle", "30m"], proj, env), "hull vm up")
    try:
        time.sleep(2)
        rss_idle = qemu_rss(f"hull-vm-{name}")
        warm = [timed(lambda: must(hull_cmd(hull, ["run", "--tier3", "--vm", name, "--", "true"], proj, env), "warm run"))
                for _ in range(a.warm_rounds)]
        print(f"warm     hull run --tier3 --vm -- true           p50 {med(warm) * 1000:7.1f} ms")
        rss = qemu_rss(f"hull-vm-{name}")
        if rss_idle and rss:
            print(f"rss      QEMU of the `hull vm up` VM: idle {rss_idle:5.0f} MiB, after {a.warm_rounds} runs {rss:5.0f} MiB")
        else:
            print("rss      QEMU not found")
        ix = incus_exec(img, accel, work, a.incus_rounds)
        print(f"incus    incus exec hull-run -- true (guest)     p50 {med(ix) * 1000:7.1f} ms  ({fmt(ix)}); ratio {med(ix) / med(warm):.1f}x")
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
