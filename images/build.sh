#!/usr/bin/env bash
# hull guest image recipe: builds a prepared tier-3 guest from Debian packages only.
#
#   build.sh OUT_DIR AGENT_DISK
#
# AGENT_DISK is the read-only ext4 holding hull-agent that hull attaches to every VM
# (hull's vm/image/agent_disk.rs makes it). The image does not contain the agent: the
# prepare boot attaches the disk as /dev/vdb, as every later boot does, to check that
# the container starts with it.
#
# OUT_DIR must not hold an earlier build; `hull image build` passes `<id>.partial-<pid>`
# (with this recipe in recipe/ and the log in build.log) and renames it to `<id>` when
# this script succeeded. The only network access is the Debian mirror
# (mmdebstrap and `apt-get download` inside the rootfs it built).
#
# stdout carries machine-readable lines only, parsed by `hull image build`:
#   @@step N/M NAME        a step starts
#   @@info KEY=VALUE       a fact for the manifest (versions, names)
#   @@error MESSAGE        why the build failed (also exits non-zero)
# Everything else (tool output) goes to stderr, which hull writes to build.log.
#
# Environment (all optional):
#   HULL_DEBIAN_MIRROR   default: the URI of the host's apt source for bookworm
#   HULL_DEBIAN_SECURITY default: the URI of the host's apt source for bookworm-security
#                        (apt-mirror.sh reads them; no mirror's name is written here)
#   HULL_IMAGE_ACCEL     accelerator for the prepare boot: tcg (default) or kvm
#   HULL_PREPARE_TIMEOUT seconds the prepare boot may take, default 1800
set -euo pipefail
umask 022
export LC_ALL=C

STEPS=8
step_no=0
step() {
  step_no=$((step_no + 1))
  printf '@@step %d/%d %s\n' "$step_no" "$STEPS" "$1"
  printf '\n==> [%s] step %d/%d: %s\n' "$(date +%T)" "$step_no" "$STEPS" "$1" >&2
}
info() { printf '@@info %s=%s\n' "$1" "$2"; }
die() {
  printf '@@error %s\n' "$*"
  printf 'build.sh: error: %s\n' "$*" >&2
  exit 1
}
trap 'rc=$?; [ $rc -eq 0 ] || printf "@@error step %d failed (exit %d) at line %d: %s\n" "$step_no" "$rc" "$LINENO" "$BASH_COMMAND"' ERR

[ $# -eq 2 ] || die "usage: build.sh OUT_DIR AGENT_DISK"
OUT=$1
AGENT_DISK=$2
RECIPE=$(cd "$(dirname "$0")" && pwd)
SUITE=bookworm
# shellcheck source=apt-mirror.sh
. "$RECIPE/apt-mirror.sh"
MIRROR=${HULL_DEBIAN_MIRROR:-$(host_apt_uri "$SUITE")}
SECURITY=${HULL_DEBIAN_SECURITY:-$(host_apt_uri "$SUITE-security")}
ACCEL=${HULL_IMAGE_ACCEL:-tcg}
PREPARE_TIMEOUT=${HULL_PREPARE_TIMEOUT:-1800}
# Disk geometry: the root ext4 holds the guest system, Incus's database and the btrfs
# loop pool (a sparse file) that holds the container image and containers.
DISK_SIZE=12G
POOL_SIZE=8GiB

[ -n "$MIRROR" ] || die "no apt source of this host serves Debian $SUITE (/etc/apt/sources.list, /etc/apt/sources.list.d): set HULL_DEBIAN_MIRROR to a Debian mirror's URI"
[ -n "$SECURITY" ] || die "no apt source of this host serves Debian $SUITE-security (/etc/apt/sources.list, /etc/apt/sources.list.d): set HULL_DEBIAN_SECURITY to a Debian security mirror's URI"
info mirror "$MIRROR"
info security_mirror "$SECURITY"
[ "$(id -u)" -eq 0 ] || die "the image build needs root: mmdebstrap's root mode and mkfs.ext4 -d keep file ownership only as root"
[ -f "$AGENT_DISK" ] || die "agent disk $AGENT_DISK is missing"
for t in mmdebstrap qemu-system-x86_64 mkfs.ext4 e2fsck zstd cpio dpkg-deb chroot xz timeout flock tar; do
  command -v "$t" >/dev/null || die "missing tool: $t"
done
mkdir -p "$OUT"
WORK="$OUT/work"
[ ! -e "$OUT/disk.raw" ] && [ ! -e "$WORK" ] || die "output dir $OUT holds an earlier build"
mkdir -p "$WORK"

read_list() { grep -v '^[[:space:]]*\(#\|$\)' "$1" | tr -s '[:space:]' ',' | sed 's/,$//'; }
sources=(
  "deb $MIRROR $SUITE main"
  "deb $MIRROR $SUITE-updates main"
  "deb $SECURITY $SUITE-security main"
  "deb $MIRROR $SUITE-backports main"
)
# Docs, man pages and translations are never read inside the sandbox.
dpkg_slim=(
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
)

# ---------------------------------------------------------------------------------------
step "packages (the container's list resolved against the mirror)"
# Before anything is built: a package the mirror does not have (a policy's `[vm]
# packages` are added to container.list) fails here, named, within seconds.
resolve_log="$WORK/resolve.log"
# A directory, its package lists kept: the sizes below are read from them.
if ! mmdebstrap --variant=minbase --mode=root --simulate --verbose --skip=cleanup/apt/lists \
  --include="$(read_list "$RECIPE/packages/container.list")" \
  "$SUITE" "$WORK/simulate" "${sources[@]}" >"$resolve_log" 2>&1; then
  cat "$resolve_log" >&2
  missing=$(sed -n "s/^E: Unable to locate package \(.*\)$/\1/p; s/^E: Package '\(.*\)' has no installation candidate$/\1/p" "$resolve_log" | sort -u | tr '\n' ' ')
  [ -z "$missing" ] || die "no such package in Debian $SUITE ($MIRROR): ${missing% }"
  die "the container's packages do not resolve in Debian $SUITE ($MIRROR): $(grep -a '^E: ' "$resolve_log" | head -n 3 | tr '\n' ' ')"
fi
cat "$resolve_log" >&2
# Each name must be a package of its own, installed by that name: apt reads a
# name it does not find as a pattern when it holds `.`, `?` or `*`
# (`texlive.+` selected 470 packages, 3.9 GB), and a virtual name installs
# another package. The simulation lists what it installs (`Inst NAME (...)`).
installed=$(sed -n 's/^Inst \([^ ]*\) .*/\1/p' "$resolve_log" | sort -u)
inexact=
for p in $(read_list "$RECIPE/packages/container.list" | tr ',' ' '); do
  grep -qxF -- "$p" <<<"$installed" || inexact="$inexact $p"
done
[ -z "$inexact" ] || die "not a package of Debian $SUITE by that exact name (apt read it as a pattern or a virtual package; name the packages themselves):$inexact"
# What the list resolves to, from the mirror's index: its download and its
# installed size are bounded (HULL_USERLAND_MAX, which hull passes).
max=${HULL_USERLAND_MAX:-5368709120}
# shellcheck disable=SC2086
read -r dl inst < <(apt-cache -o Dir="$WORK/simulate" -o Dir::State::Status="$WORK/simulate/var/lib/dpkg/status" \
  show --no-all-versions $installed 2>/dev/null |
  awk '/^Size:/ { d += $2 } /^Installed-Size:/ { i += $2 } END { printf "%d %d\n", d, i * 1024 }')
rm -rf "$WORK/simulate"
info packages_download_bytes "$dl"
info packages_installed_bytes "$inst"
[ "${dl:-0}" -gt 0 ] && [ "${inst:-0}" -gt 0 ] || die "cannot read the sizes of the container's packages from the mirror's index"
[ "$dl" -le "$max" ] && [ "$inst" -le "$max" ] ||
  die "the container's packages take $((dl >> 20)) MiB to download and $((inst >> 20)) MiB installed, more than HULL_USERLAND_MAX ($((max >> 20)) MiB)"

# The container's userland depends on nothing of the guest's: it is made while
# steps 2 to 4 run (two mmdebstraps at once, each mostly on one core or waiting
# on the mirror), in a process group of its own (killed with the build when a
# step fails), its output kept apart and shown at step 5.
IMPORT="$WORK/import"
mkdir -p "$IMPORT"
container_image() {
  if [ -f "$OUT/container-rootfs.tar" ]; then
    # A policy's `[vm] rootfs`: hull checked the tarball entry by entry and wrote
    # this one from it (the hull user, /opt/hull); nothing of it runs on the host.
    zstd -q -T0 --rm -o "$IMPORT/rootfs.tar.zst" "$OUT/container-rootfs.tar"
  else
    mmdebstrap --variant=minbase --mode=root \
      --include="$(read_list "$RECIPE/packages/container.list")" \
      "${dpkg_slim[@]}" \
      --customize-hook="$RECIPE/hooks/container-customize" \
      --customize-hook='chroot "$1" apt-get clean' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' \
      "$SUITE" "$IMPORT/rootfs.tar.zst" "${sources[@]}"
  fi
}
container_log="$WORK/container.log"
set -m
(trap - ERR && container_image) >"$container_log" 2>&1 &
container_pid=$!
set +m
stop_container_image() {
  [ -n "${container_pid:-}" ] || return 0
  kill -TERM -- "-$container_pid" 2>/dev/null || true
  wait "$container_pid" 2>/dev/null || true
}
trap stop_container_image EXIT

# Steps 2 to 4 make the guest's own system (rootfs, kernel, initrd): the same for
# every image of this recipe, whatever its container's userland. Where hull names
# a directory for it (HULL_GUEST_BASES, the cache's bases/), it is made once, kept
# under the key of everything it is made from (this script, the guest's list, its
# hook, the initrd's init, the apt sources), and copied by the next build of
# another userland (a policy's `[vm] packages` or `[vm] rootfs`): about 80 s less.
# Readers hold the base's lock shared; only a base no build holds is removed.
BASE_KEY=$({
  cat "$RECIPE/build.sh" "$RECIPE/packages/guest.list" "$RECIPE/hooks/guest-download" "$RECIPE/initrd/init"
  printf '%s\n' "${sources[@]}"
} | sha256sum | cut -c1-16)
info guest_base "$BASE_KEY"
step "guest rootfs (mmdebstrap, or the one an earlier build kept)"
BASE=
if [ -n "${HULL_GUEST_BASES:-}" ]; then
  BASE="$HULL_GUEST_BASES/$BASE_KEY"
  mkdir -p -m 0700 "$HULL_GUEST_BASES"
  # One build makes a base; another that wants it at the same time waits for it
  # (its container is made meanwhile) instead of making it twice.
  exec {make_fd}>"$HULL_GUEST_BASES/$BASE_KEY.lock"
  if ! flock -n -x "$make_fd"; then
    printf 'build.sh: waiting for another build making the guest system %s\n' "$BASE_KEY" >&2
    flock -x "$make_fd"
  fi
fi
ROOT="$WORK/guest"
# A base whose lock was taken after its removal began is gone: made again.
if [ -n "$BASE" ] && [ -f "$BASE/complete" ] && exec {base_fd}<"$BASE/complete" &&
  flock -s "$base_fd" && [ -f "$BASE/guest.tar.zst" ] && [ -f "$BASE/info" ]; then
  printf 'build.sh: the guest system %s an earlier build kept\n' "$BASE_KEY" >&2
  mkdir -p "$ROOT"
  zstd -dcq "$BASE/guest.tar.zst" | tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' -xpf -
  while IFS='=' read -r k v; do info "$k" "$v"; done <"$BASE/info"
  info guest_base_reused 1
  step "kernel (kept: vmlinux)"
  cp "$BASE/vmlinux" "$BASE/kernel.config" "$OUT/"
  step "initrd (kept)"
  cp "$BASE/initrd.cpio" "$OUT/"
else
  ROOT="$WORK/guest"
  mmdebstrap --variant=minbase --mode=root --format=directory \
    --include="$(read_list "$RECIPE/packages/guest.list")" \
    "${dpkg_slim[@]}" \
    --customize-hook="$RECIPE/hooks/guest-download" \
    --customize-hook="copy-out /tmp/hull-debs $WORK" \
    --customize-hook='rm -rf "$1/tmp/hull-debs"' \
    --customize-hook='chroot "$1" apt-get clean' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' \
    "$SUITE" "$ROOT" "${sources[@]}" >&2
  info incus_version "$(chroot "$ROOT" dpkg-query -W -f='${Version}' incus-base)"

  # ---------------------------------------------------------------------------------------
  step "kernel (vmlinux, modules)"
  kdeb=$(ls "$WORK"/hull-debs/linux-image-*.deb)
  mkdir -p "$WORK/kernel"
  dpkg-deb -x "$kdeb" "$WORK/kernel"
  KVER=$(ls "$WORK/kernel/lib/modules")
  info kernel_version "$KVER"
  info kernel_package "$(basename "$kdeb")"
  # The bzImage carries a zstd-compressed ELF; QEMU boots the ELF through its PVH note,
  # which skips the in-guest decompression (about twice as fast under TCG).
  vmlinuz="$WORK/kernel/boot/vmlinuz-$KVER"
  found=0
  for off in $(grep -obUaP '\x28\xb5\x2f\xfd' "$vmlinuz" | cut -d: -f1); do
    tail -c +"$((off + 1))" "$vmlinuz" | zstd -dcq 2>/dev/null >"$OUT/vmlinux" || true
    if [ "$(head -c 4 "$OUT/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
      found=1
      break
    fi
  done
  [ "$found" -eq 1 ] || die "no zstd-compressed ELF found in $vmlinuz"
  cp "$WORK/kernel/boot/config-$KVER" "$OUT/kernel.config"
  # Modules go into the guest, decompressed (busybox insmod and a fast modprobe under TCG).
  rm -rf "$ROOT/lib/modules/$KVER"
  mkdir -p "$ROOT/lib/modules"
  cp -a "$WORK/kernel/lib/modules/$KVER" "$ROOT/lib/modules/"
  find "$ROOT/lib/modules/$KVER" -name '*.ko.xz' -exec xz -d {} +
  chroot "$ROOT" depmod -a "$KVER"

  # ---------------------------------------------------------------------------------------
  step "initrd (busybox, virtio_blk, virtio_rng)"
  # The 6.12 cloud kernel has virtio-pci, virtiofs and ext4 built in but virtio_blk is a
  # module; NVMe is built in but QEMU's nvme device blocks migration (snapshots), so the
  # root disk is virtio-blk and this tiny initrd loads the driver and switches root.
  # virtio_rng seeds the kernel's CRNG from the host at once: without it, incusd (Go reads
  # getrandom at start) waits about 6 s for the CRNG under TCG.
  IRD="$WORK/initrd"
  mkdir -p "$IRD"/{bin,dev,proc,sys,newroot,modules}
  dpkg-deb -x "$(ls "$WORK"/hull-debs/busybox-static_*.deb)" "$WORK/busybox"
  cp "$WORK/busybox/bin/busybox" "$IRD/bin/busybox"
  for mod in virtio_blk virtio_rng; do
    for m in $(chroot "$ROOT" modprobe -S "$KVER" --show-depends "$mod" | awk '$1 == "insmod" { print $2 }'); do
      [ -e "$IRD/modules/$(basename "$m")" ] && continue
      cp "$ROOT$m" "$IRD/modules/"
      basename "$m" >>"$IRD/modules/order"
    done
  done
  install -m 0755 "$RECIPE/initrd/init" "$IRD/init"
  (cd "$IRD" && find . -print0 | sort -z | cpio --null -o -H newc --quiet --owner=0:0) >"$OUT/initrd.cpio"
  if [ -n "$BASE" ]; then
    # Kept for the next build: written aside, then renamed whole (a build that
    # finished first keeps its own).
    keep="$BASE.partial-$$"
    rm -rf "$keep" && mkdir -p "$keep"
    tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' -cf - . | zstd -q -1 -T0 -o "$keep/guest.tar.zst"
    cp "$OUT/vmlinux" "$OUT/kernel.config" "$OUT/initrd.cpio" "$keep/"
    {
      printf 'incus_version=%s\n' "$(chroot "$ROOT" dpkg-query -W -f='${Version}' incus-base)"
      printf 'kernel_version=%s\n' "$KVER"
      printf 'kernel_package=%s\n' "$(basename "$kdeb")"
    } >"$keep/info"
    : >"$keep/complete"
    mv -T "$keep" "$BASE" 2>/dev/null || rm -rf "$keep"
  fi
  info guest_base_reused 0
fi
[ -z "${make_fd:-}" ] || exec {make_fd}>&-
if [ -n "$BASE" ]; then
  # One base is kept: another recipe's (an older hull's) goes once no build
  # reads it, and so do the remains of a build that died while keeping one.
  for other in "$HULL_GUEST_BASES"/*; do
    [ "$other" = "$BASE" ] && continue
    case "$other" in
      *.partial-*) kill -0 "${other##*.partial-}" 2>/dev/null || rm -rf "$other" ;;
      *.lock) [ "$other" = "$BASE.lock" ] || flock -n -x "$other" rm -f "$other" || true ;;
      *) [ -f "$other/complete" ] && flock -n -x "$other/complete" rm -rf "$other" || true ;;
    esac
  done
fi

# ---------------------------------------------------------------------------------------
step "container image (mmdebstrap)"
[ -f "$OUT/container-rootfs.tar" ] && info container_source "[vm] rootfs"
container_rc=0
wait "$container_pid" || container_rc=$?
container_pid=
cat "$container_log" >&2
[ "$container_rc" -eq 0 ] || die "the container image failed (exit $container_rc): $(grep -a '^E: ' "$container_log" | head -n 3 | tr '\n' ' ')"
now=$(date +%s)
mkdir -p "$WORK/meta"
sed "s/@CREATION_DATE@/$now/" "$RECIPE/guest/metadata.yaml" >"$WORK/meta/metadata.yaml"
tar -C "$WORK/meta" --owner=0 --group=0 -cf "$IMPORT/metadata.tar" metadata.yaml
info container_rootfs_bytes "$(stat -c %s "$IMPORT/rootfs.tar.zst")"

# ---------------------------------------------------------------------------------------
step "guest disk (mkfs.ext4)"
install -m 0755 "$RECIPE/guest/hull-init" "$ROOT/sbin/hull-init"
install -d -m 0755 "$ROOT/usr/lib/hull" "$ROOT/opt/hull"
install -m 0755 "$RECIPE/guest/hull-prepare" "$ROOT/usr/lib/hull/hull-prepare"
sed "s/@POOL_SIZE@/$POOL_SIZE/" "$RECIPE/guest/preseed.yaml" >"$ROOT/usr/lib/hull/preseed.yaml"
# Incus maps container ids through root's subordinate ranges; guest uid/gid 1000 (what
# the host's virtiofsd translates the host user to) is delegated for raw.idmap.
printf 'root:1000000:1000000000\nroot:1000:1\n' >"$ROOT/etc/subuid"
printf 'root:1000000:1000000000\nroot:1000:1\n' >"$ROOT/etc/subgid"
echo hull >"$ROOT/etc/hostname"
printf '127.0.0.1 localhost hull\n::1 localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/resolv.conf"
install -d -m 0755 "$ROOT/mnt/hull" "$ROOT/mnt/import" "$ROOT/var/log/incus"
mkfs.ext4 -q -F -L hullroot -E lazy_itable_init=0,lazy_journal_init=0 -d "$ROOT" "$OUT/disk.raw" "$DISK_SIZE" >&2
mkfs.ext4 -q -F -L hullimport -d "$IMPORT" "$WORK/import.ext4" \
  "$(($(du -sm "$IMPORT" | cut -f1) + 64))M" >&2
info rootfs_bytes "$(du -sb "$ROOT" | cut -f1)"

# ---------------------------------------------------------------------------------------
step "prepare (boot, incus init, import, base container)"
console="$OUT/prepare-console.log"
# Both vCPUs on one TCG thread: QEMU 10.0's multi-threaded TCG can abort
# (iotlb_to_section assertion) when a vCPU touches MMIO while another
# reprograms the memory map, as a booting guest does (seen here under load).
# This prepare takes about 150 s here against 105 s multi-threaded, and
# 160 s with a single vCPU.
accel_args=(-accel tcg,thread=single)
[ "$ACCEL" = kvm ] && accel_args=(-accel kvm -cpu host)
started=$(date +%s)
timeout --kill-after=10 "$PREPARE_TIMEOUT" qemu-system-x86_64 "${accel_args[@]}" \
  -M pc -nodefaults -no-user-config -m 2048 -smp 2 -display none -no-reboot \
  -kernel "$OUT/vmlinux" -initrd "$OUT/initrd.cpio" \
  -append "console=ttyS0 panic=-1 root=/dev/vda hull.mode=prepare" \
  -serial "file:$console" \
  -drive "file=$OUT/disk.raw,format=raw,if=none,id=root,cache=unsafe,discard=unmap" \
  -device virtio-blk-pci,drive=root \
  -drive "file=$AGENT_DISK,format=raw,if=none,id=agent,readonly=on" \
  -device virtio-blk-pci,drive=agent \
  -drive "file=$WORK/import.ext4,format=raw,if=none,id=import,readonly=on" \
  -device virtio-blk-pci,drive=import \
  -device virtio-rng-pci >&2 || {
  rc=$?
  why="QEMU exit $rc"
  [ "$rc" -eq 124 ] && why="timed out after ${PREPARE_TIMEOUT}s"
  die "prepare boot failed ($why); console log: $console"
}
info prepare_seconds "$(($(date +%s) - started))"
grep -q '^HULL-PREPARE-OK' "$console" ||
  die "prepare did not finish inside the guest; console log: $console: $(grep -a 'hull-prepare: error' "$console" | tail -n 1)"
grep -a '^@@guest ' "$console" | sed 's/^@@guest /@@info /' | tr -d '\r' || true

# ---------------------------------------------------------------------------------------
step "finish (fsck, checks)"
e2fsck -fn "$OUT/disk.raw" >&2 || die "the prepared disk does not pass e2fsck"
sync
rm -rf "$WORK"
chmod 0444 "$OUT/disk.raw" "$OUT/vmlinux" "$OUT/initrd.cpio"
info disk_allocated_bytes "$(($(stat -c %b "$OUT/disk.raw") * 512))"
info disk_bytes "$(stat -c %s "$OUT/disk.raw")"
info vmlinux_bytes "$(stat -c %s "$OUT/vmlinux")"
info initrd_bytes "$(stat -c %s "$OUT/initrd.cpio")"
