#!/usr/bin/env python3
"""Experiment (issue 5): does Incus `shift=true` (idmapped mounts) work on a
virtiofs share in the 6.12 guest, so that `raw.idmap` could go?

Boots the built image in its debug mode with one virtiofs share served by
`virtiofsd --posix-acl=always` (the kernel only allows idmapped FUSE mounts
with default_permissions, which FUSE_POSIX_ACL gives; virtiofsd 1.14
advertises FUSE_ALLOW_IDMAP), adds the share to hull-run with `shift=true`,
starts it, lists the share and writes to it as container uid 1000.

  mkdir -p /tmp/shx/share && echo two > /tmp/shx/share/g && chown 2000:2000 /tmp/shx/share/g
  python3 benches/experiments/shift_true.py ~/.cache/hull/images/<id>

Result here (2026-12-02): the device is added and the container starts; a
file of guest uid 2000 (not in raw.idmap) shows as 2000 inside the container
instead of 65534, and the write lands on the host as uid 1000. hull does not
use this yet (it keeps raw.idmap and virtiofsd's uid translation).
"""
import os, re, socket, subprocess, sys, time
img = sys.argv[1]
w = "/tmp/shx"
vsock = f"{w}/vfs.sock"; dbg = f"{w}/dbg.sock"
for p in (vsock, dbg):
    try: os.unlink(p)
    except FileNotFoundError: pass
vfs = subprocess.Popen([os.path.expanduser("~/.cargo/bin/virtiofsd"), f"--socket-path={vsock}", f"--shared-dir={w}/share",
                        "--sandbox=namespace", "--posix-acl=always", "--cache=auto"], stderr=open(f"{w}/vfs.log","w"))
time.sleep(1)
q = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg", "-M", "pc", "-nodefaults", "-no-user-config", "-display", "none",
    "-no-reboot", "-nic", "none", "-m", "2048", "-smp", "2", "-cpu", "max",
    "-object", "memory-backend-memfd,id=mem,size=2048M,share=on", "-numa", "node,memdev=mem",
    "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
    "-kernel", f"{img}/vmlinux", "-initrd", f"{img}/initrd.cpio",
    "-append", "console=ttyS0 quiet panic=-1 root=/dev/vda hull.mode=debug",
    "-drive", f"file={img}/disk.raw,if=none,id=d0,format=raw,snapshot=on", "-device", "virtio-blk-pci,drive=d0",
    "-chardev", f"socket,id=fs0,path={vsock}", "-device", "vhost-user-fs-pci,chardev=fs0,tag=x",
    "-serial", f"unix:{dbg},server=on,wait=off"], env=dict(os.environ, TMPDIR=w), stderr=open(f"{w}/qemu.log","w"))
try:
    for _ in range(200):
        if os.path.exists(dbg): break
        time.sleep(0.05)
    s = socket.socket(socket.AF_UNIX); s.connect(dbg); s.settimeout(1)
    buf = b""
    def until(rx, limit=400):
        global buf
        end = time.time() + limit
        while re.search(rx, buf) is None:
            if time.time() > end: print(buf[-3000:].decode(errors="replace")); sys.exit("timeout " + str(rx))
            try: buf += s.recv(65536)
            except socket.timeout: pass
    until(rb"debug shell on ttyS0"); time.sleep(1)
    cmd = ("incus admin waitready --timeout=300; mkdir -p /mnt/x /run/hull/ctl/hull-run; mount -t virtiofs x /mnt/x && echo MNT-$?; ls -ln /mnt/x; "
           "chown $(incus config get hull-run volatile.idmap.next | tr '{' '\\n' | grep '\"Nsid\":0,' | grep Isuid | sed 's/.*Hostid.:\\([0-9]*\\).*/\\1/' | head -n1) /run/hull/ctl/hull-run; "
           "incus config device add hull-run sx disk source=/mnt/x path=/sx shift=true; echo ADD-$?; "
           "incus start hull-run; echo START-$?; sleep 2; "
           "P=$(incus query /1.0/instances/hull-run/state | sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p' | head -n1); "
           "nsenter -t $P -m -U -- ls -ln /sx; nsenter -t $P -m -U -S 1000 -G 1000 -- sh -c 'echo w > /sx/w && echo WROTE'; echo DONE-$((40+2))\n")
    s.sendall(cmd.encode())
    until(rb"DONE-42", 600)
    time.sleep(1)
    try: buf += s.recv(65536)
    except socket.timeout: pass
    print(buf.decode(errors="replace")[-4000:])
finally:
    q.kill(); vfs.kill()
