#!/usr/bin/env bash
# Installs what hull needs on a fresh Debian 12 (bookworm) or Ubuntu machine.
# Idempotent: each step checks first and does nothing when already present.
#   scripts/setup.sh            host tiers (bubblewrap, landlock) + toolchain targets
#   scripts/setup.sh --tier3    also QEMU 10 (backports), virtiofsd, mmdebstrap
#   scripts/setup.sh --fuzz     also a nightly toolchain and cargo-fuzz (fuzz/)
#   scripts/setup.sh --test     also cargo-nextest, the test runner (scripts/test.sh), chromium,
#                               the clients the tests run, and the adapters' venv
set -euo pipefail

want_tier3=0
want_fuzz=0
want_test=0
for a in "$@"; do
  case "$a" in
    --tier3) want_tier3=1 ;;
    --fuzz) want_fuzz=1 ;;
    --test) want_test=1 ;;
    *) echo "setup.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
say() { printf '==> [%s] %s\n' "$(date +%T)" "$*" >&2; }

# Up front: what this script needs (root for apt-get) and what the kernel
# gives the tiers, before minutes of installing.
if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
  echo "setup.sh: installs packages with apt-get: run it as root, or install sudo" >&2
  exit 1
fi
command -v apt-get >/dev/null || {
  echo "setup.sh: needs a Debian or Ubuntu host (apt-get); install bubblewrap and the Rust toolchain by hand elsewhere" >&2
  exit 1
}
kver=$(uname -r)
kmaj=${kver%%.*}
kmin=${kver#*.}
kmin=${kmin%%[!0-9]*}
if [ "$kmaj" -lt 6 ] || { [ "$kmaj" -eq 6 ] && [ "$kmin" -lt 12 ]; }; then
  say "note: kernel $kver is older than 6.12 (Landlock ABI 6, which scopes signals and abstract sockets): the landlock tier will be unavailable here (hull probe says why); bwrap and tier 3 work"
elif [ -r /sys/kernel/security/lsm ] && ! grep -qw landlock /sys/kernel/security/lsm; then
  say "note: Landlock is not in this kernel's active LSMs ($(cat /sys/kernel/security/lsm)): the landlock tier will be unavailable; bwrap and tier 3 work"
fi

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    say "apt-get update"
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need_pkgs=()
command -v bwrap >/dev/null || need_pkgs+=(bubblewrap)
command -v hyperfine >/dev/null || need_pkgs+=(hyperfine)
command -v cc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v pkg-config >/dev/null || need_pkgs+=(pkg-config)
command -v git >/dev/null || need_pkgs+=(git)
# The canary's HTML page is rendered by headless Chromium in the tests.
if [ "$want_test" -eq 1 ]; then
  command -v chromium >/dev/null || need_pkgs+=(chromium)
  # `hull man`'s page is rendered by man in a test.
  command -v man >/dev/null || need_pkgs+=(man-db)
  # Real clients through the network proxy in the tests.
  command -v curl >/dev/null || need_pkgs+=(curl)
  python3 -m pip --version >/dev/null 2>&1 || need_pkgs+=(python3-pip)
  command -v npm >/dev/null || need_pkgs+=(npm)
  command -v openssl >/dev/null || need_pkgs+=(openssl)
  # A venv in the project, made inside the sandbox by Debian's python3.
  /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
  # The real-workload tests fetch a Debian source package (apt-get source)
  # and unpack it with dpkg-source.
  command -v dpkg-source >/dev/null || need_pkgs+=(dpkg-dev)
  # `hull batch --shard` under a real scheduler: the batch tests start
  # munged, slurmctld and slurmd of their own (tests/src/slurm.rs).
  [ -x /usr/sbin/munged ] || need_pkgs+=(munge)
  [ -x /usr/sbin/slurmctld ] || need_pkgs+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || need_pkgs+=(slurmd)
  command -v sbatch >/dev/null || need_pkgs+=(slurm-client)
  # `--image docker://...`: the tests pull from a registry of their own on
  # loopback (Debian's docker-registry, started by the test).
  [ -x /usr/bin/docker-registry ] || need_pkgs+=(docker-registry)
  # ... and run images buildah made (from scratch, no runtime needed).
  command -v buildah >/dev/null || need_pkgs+=(buildah)
fi
if [ "$want_tier3" -eq 1 ]; then
  command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
  command -v zstd >/dev/null || need_pkgs+=(zstd)
  command -v mkfs.ext4 >/dev/null || need_pkgs+=(e2fsprogs)
  command -v cpio >/dev/null || need_pkgs+=(cpio)
  command -v xz >/dev/null || need_pkgs+=(xz-utils)
  command -v qemu-img >/dev/null || need_pkgs+=(qemu-utils)
  # A static busybox: the initramfs of the host-side VM tests.
  dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
  command -v mkfs.btrfs >/dev/null || need_pkgs+=(btrfs-progs)
  dpkg -s libseccomp-dev >/dev/null 2>&1 || need_pkgs+=(libseccomp-dev)
  dpkg -s libcap-ng-dev >/dev/null 2>&1 || need_pkgs+=(libcap-ng-dev)
  dpkg -s debian-archive-keyring >/dev/null 2>&1 || need_pkgs+=(debian-archive-keyring)
fi
[ "${#need_pkgs[@]}" -eq 0 ] || apt_install "${need_pkgs[@]}"

if [ "$want_tier3" -eq 1 ]; then
  # QEMU 10 from bookworm-backports (bookworm's 7.2 lacks mapped-ram migration).
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ] && [ ! -f /etc/apt/sources.list.d/bookworm-backports.sources ]; then
    say "adding bookworm-backports"
    # From the mirror the host already uses for bookworm.
    . "$(dirname "$0")/../images/apt-mirror.sh"
    mirror=${HULL_DEBIAN_MIRROR:-$(host_apt_uri bookworm)}
    [ -n "$mirror" ] || { echo "setup.sh: no apt source of this host serves bookworm; set HULL_DEBIAN_MIRROR" >&2; exit 1; }
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null <<SRC
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt_updated=0
  fi
  qemu_major=0
  if command -v qemu-system-x86_64 >/dev/null; then
    qemu_major=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9]*\).*/\1/p')
  fi
  if [ "${qemu_major:-0}" -lt 9 ]; then
    if [ "${VERSION_CODENAME:-}" = bookworm ]; then
      apt_updated=0
      apt_install -t bookworm-backports qemu-system-x86
    else
      apt_install qemu-system-x86
    fi
  fi
  if ! command -v virtiofsd >/dev/null && [ ! -x /usr/libexec/virtiofsd ] && [ ! -x "$HOME/.cargo/bin/virtiofsd" ]; then
    say "cargo install virtiofsd (a few minutes)"
    cargo install virtiofsd --version 1.14.0 --locked --quiet
  fi
fi

# When hull runs as root, the process tiers run the command as this
# unprivileged system user (orchestrator/src/tier/identity.rs).
if ! getent passwd hull-sandbox >/dev/null; then
  say "useradd hull-sandbox (the sandboxed command's user when hull runs as root)"
  $SUDO useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin hull-sandbox
fi

# The test runner (scripts/test.sh, .config/nextest.toml).
if [ "$want_test" -eq 1 ] && ! cargo nextest --version >/dev/null 2>&1; then
  say "cargo install cargo-nextest (a few minutes)"
  (cd / && cargo install --locked cargo-nextest --quiet)
fi

# The adapters' tests (tests/tests/adapters.rs): inspect_ai and
# mini-swe-agent at the versions adapters/python/requirements.lock pins, and
# hull's adapter package, in a venv of Debian's python3 under target/; made
# again when the lock or the package's metadata change.
if [ "$want_test" -eq 1 ]; then
  repo=$(cd "$(dirname "$0")/.." && pwd)
  venv="$repo/target/adapters-venv"
  want=$(cat "$repo/adapters/python/requirements.lock" "$repo/adapters/python/pyproject.toml" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.made-from" 2>/dev/null)" != "$want" ]; then
    say "python venv for the adapters' tests: inspect_ai, mini-swe-agent (a minute)"
    rm -rf "$venv"
    mkdir -p "$repo/target"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$repo/adapters/python/requirements.lock"
    "$venv/bin/pip" install --quiet --no-deps -e "$repo/adapters/python"
    echo "$want" >"$venv/.made-from"
  fi
fi

# Foreign targets: the macOS and Windows code type-checks from Linux; musl
# builds tier 3's static agent (the container's init loads nothing of the
# container's userland).
if command -v rustup >/dev/null; then
  installed=$(rustup target list --installed)
  for t in x86_64-pc-windows-gnu aarch64-apple-darwin x86_64-unknown-linux-musl; do
    grep -qx "$t" <<<"$installed" || { say "rustup target add $t"; rustup target add "$t" >/dev/null; }
  done
fi
if [ "$want_fuzz" -eq 1 ]; then
  # cargo-fuzz needs nightly (-Z sanitizer) and a C++ compiler for libFuzzer.
  command -v g++ >/dev/null || apt_install g++
  rustup toolchain list | grep -q '^nightly' || { say "rustup toolchain install nightly"; rustup toolchain install nightly --profile minimal >/dev/null; }
  command -v cargo-fuzz >/dev/null || { say "cargo install cargo-fuzz"; (cd / && cargo install cargo-fuzz --locked --quiet); }
fi
say "setup done"
