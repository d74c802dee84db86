#!/usr/bin/env bash
# Sets up what is missing, then runs every check and test of hull:
# format, clippy (Linux, macOS and Windows targets), the build, the tier-3
# guest image, the native tests (unit, golden, CLI, escape matrix on landlock
# and bwrap), the tier-3 tests (escape matrix on the VM, the VM CLI, the
# image contract, the busybox-guest tests), and the doc tests.
#
# Tests run under cargo-nextest's `ci` profile (.config/nextest.toml): every
# test has a deadline and is killed and named past it; nothing is retried;
# JUnit goes to target/nextest/ci/. Every step runs even when an earlier one
# failed (a fmt slip does not hide a failing test); the script ends with a
# table of each step's time, the ten slowest tests and the ignored tests, and
# exits non-zero when any step failed. docs/testing.md says more.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

# The tier-3 tests are compiled in by these features: this script declares
# that the machine runs tier 3 (setup.sh --tier3 installs what it needs).
FEATURES="hull/tier3,hull-tests/tier3"
NO_DEFAULT=()
NEXTEST_OUT=target/nextest/ci

names=()
secs=()
results=()
failed=0

# step NAME CMD...: runs CMD, records its time and result.
step() {
  local name=$1
  shift
  printf '\n==> %s\n' "$name" >&2
  local t0 rc
  t0=$(date +%s)
  "$@"
  rc=$?
  names+=("$name")
  secs+=($(($(date +%s) - t0)))
  if [ "$rc" -eq 0 ]; then
    results+=("ok")
  else
    results+=("FAILED (exit $rc)")
    failed=1
  fi
  return 0
}

# nextest_run NAME JUNIT_COPY ARGS...: one nextest run of the ci profile,
# its JUnit kept under its own name (each run rewrites junit.xml).
nextest_run() {
  local copy=$1
  shift
  rm -f "$NEXTEST_OUT/junit.xml"
  cargo nextest run --workspace --locked "${NO_DEFAULT[@]}" --features "$FEATURES" --profile ci "$@"
  local rc=$?
  [ -f "$NEXTEST_OUT/junit.xml" ] && mv "$NEXTEST_OUT/junit.xml" "$NEXTEST_OUT/$copy"
  return "$rc"
}

summary() {
  printf '\n==> summary\n'
  local total=0 i
  printf '  %-34s %8s  %s\n' step time result
  for i in "${!names[@]}"; do
    printf '  %-34s %5dm%02ds  %s\n' "${names[$i]}" $((secs[i] / 60)) $((secs[i] % 60)) "${results[$i]}"
    total=$((total + secs[i]))
  done
  printf '  %-34s %5dm%02ds\n' 'sum of the steps' $((total / 60)) $((total % 60))
  # The images build beside the native tests: the wall time is less.
  printf '  %-34s %5dm%02ds\n' 'wall time' $((SECONDS / 60)) $((SECONDS % 60))

  # The ten slowest tests of both runs, from their JUnit reports.
  local reports=()
  for f in "$NEXTEST_OUT"/junit-*.xml; do [ -f "$f" ] && reports+=("$f"); done
  if [ "${#reports[@]}" -gt 0 ]; then
    printf '\n  ten slowest tests:\n'
    awk '
      /<testcase / {
        name = $0; sub(/.*<testcase[^>]* name="/, "", name); sub(/".*/, "", name)
        cls = $0; sub(/.*classname="/, "", cls); sub(/".*/, "", cls)
        t = $0; sub(/.* time="/, "", t); sub(/".*/, "", t)
        printf "%9.1fs  %s %s\n", t, cls, name
      }' "${reports[@]}" | sort -rn | head -n 10 | sed 's/^/  /'
  fi

  # Ignored tests and why: every #[ignore = "reason"] in the sources.
  local ignored
  ignored=$(grep -rn --include='*.rs' -A4 '#\[ignore' crates orchestrator guest-agent protocol tests 2>/dev/null |
    awk '
      /#\[ignore/ { reason = $0; sub(/.*#\[ignore *=? *"?/, "", reason); sub(/"?\]$/, "", reason); want = 1; next }
      want && /fn [a-z_0-9]+/ { f = $0; sub(/.*fn /, "", f); sub(/\(.*/, "", f); printf "    %s: %s\n", f, reason; want = 0 }')
  printf '\n  ignored tests: %d\n' "$(grep -c . <<<"$ignored")"
  [ -n "$ignored" ] && printf '%s\n' "$ignored"
  if [ "$(id -u)" -eq 0 ]; then
    printf '    (run here anyway, as root: the ones that need root)\n'
  fi
}
trap summary EXIT

# record_steps FILE: the steps of a background job, for the summary.
record_steps() {
  local i
  for i in "${!names[@]}"; do
    printf '%s\t%s\t%s\n' "${names[$i]}" "${secs[$i]}" "${results[$i]}"
  done >"$1"
}
# merge_steps FILE NAME LOG: the steps FILE recorded join the summary; a
# job that recorded nothing failed as NAME (its output is in LOG).
merge_steps() {
  if [ -f "$1" ]; then
    while IFS=$'\t' read -r name s r; do
      names+=("$name")
      secs+=("$s")
      results+=("$r")
      [ "$r" = ok ] || failed=1
    done <"$1"
  else
    names+=("$2")
    secs+=(0)
    results+=("FAILED (no record: see $3)")
    failed=1
  fi
}

# The setup mostly waits on the network (apt, the adapters' venv), and the
# build needs only the Rust toolchain and a linker: where both are there
# (asking cargo installs the pinned toolchain first), the setup runs in the
# background beside fmt and the build, and what needs it waits for it.
mkdir -p target
rm -f target/setup-steps.tsv
setup_pid=
if command -v cc >/dev/null 2>&1 && cargo --version >/dev/null 2>&1; then
  printf '\n==> setup (in the background beside the build: target/setup.log)\n' >&2
  (
    names=() secs=() results=()
    step "setup" bash scripts/setup.sh --tier3 --test
    record_steps target/setup-steps.tsv
  ) >target/setup.log 2>&1 </dev/null &
  setup_pid=$!
else
  step "setup" bash scripts/setup.sh --tier3 --test
fi

step "fmt" cargo fmt --all -- --check
step "build" cargo build --workspace --locked --features "$FEATURES"

if [ -n "$setup_pid" ]; then
  t0=$(date +%s)
  wait "$setup_pid"
  printf '\n==> setup (waited %ss after the build)\n' $(($(date +%s) - t0)) >&2
  cat target/setup.log >&2
  merge_steps target/setup-steps.tsv setup target/setup.log
fi

# Tier 3's agent is the container's init: static (musl, whose target the
# setup adds), so it loads nothing from the container's userland (a [vm]
# rootfs is anyone's).
step "build (static agent)" cargo build --locked -p hull-agent --target x86_64-unknown-linux-musl
agent="$PWD/target/x86_64-unknown-linux-musl/debug/hull-agent"

# The landlock tier needs Landlock ABI 6 (Linux 6.12): on an older kernel
# (Debian 12's 6.1 has ABI 2) say so once, with hull probe's reason, and
# build the tests without the tier (the machine declares it lacks it)
# instead of failing every landlock test.
landlock_probe=$(target/debug/hull probe --json --tier landlock 2>&1 || true)
if ! printf '%s' "$landlock_probe" | grep -q '"available": true'; then
  why=$(printf '%s' "$landlock_probe" | sed -n 's/.*"reason": "\(.*\)",*$/\1/p' | head -n 1)
  echo "==> the landlock tier is unavailable on this host: ${why:-$landlock_probe}" >&2
  echo "==> its tests are left out: hull-tests is built without its landlock feature" >&2
  FEATURES="$FEATURES,hull-tests/bwrap"
  NO_DEFAULT=(--no-default-features)
fi

# Tier 3 needs the guest image built for this recipe (cached under
# ~/.cache/hull/images by the recipe's hash: rebuilt only when it changed; the
# only network use is the Debian mirror during the build). This hull-agent
# gets its own disk and snapshot beside it (a boot, not a rebuild).
# The container userland the registry cases run on tier 3 (pip, npm, curl
# in the container) is an image of its own, cached by its package list.
# A whole container userland from a tarball (`[vm] rootfs`): a Debian minbase
# with `hello`, made once from the host's own mirror and cached (so its image,
# cached by the tarball's digest, is built once too), then its image.
rootfs_tar="${XDG_CACHE_HOME:-$HOME/.cache}/hull-tests/rootfs-hello.tar"
make_rootfs_tar() {
  [ -f "$rootfs_tar" ] && return 0
  mkdir -p "$(dirname "$rootfs_tar")"
  # shellcheck source=../images/apt-mirror.sh
  local mirror
  mirror=$(. images/apt-mirror.sh && host_apt_uri bookworm)
  [ -n "$mirror" ] || { echo "no apt source of this host serves Debian bookworm" >&2; return 1; }
  # mmdebstrap picks its output format from the target's extension, and
  # `.partial` is none of its: without --format it made a directory there.
  rm -rf "$rootfs_tar.partial"
  SOURCE_DATE_EPOCH=1700000000 timeout 600 mmdebstrap --variant=minbase --mode=root --format=tar \
    --include=hello bookworm "$rootfs_tar.partial" "deb $mirror bookworm main" >&2 &&
    mv "$rootfs_tar.partial" "$rootfs_tar"
}
# The tests' rootfs is hostile (tests/fixtures/hostile-rootfs): the sound
# tarball with a library preloaded into every program of the container and
# account lines glibc reads as `hull` or id 1000; named by the fixture's
# digest, so a changed fixture makes a new one.
fixture=tests/fixtures/hostile-rootfs
hostile_tar="${XDG_CACHE_HOME:-$HOME/.cache}/hull-tests/rootfs-hostile-$(cat "$fixture"/* | sha256sum | cut -c1-12).tar"
export HULL_TEST_ROOTFS="$hostile_tar"
make_hostile_tar() {
  [ -f "$hostile_tar" ] && return 0
  make_rootfs_tar || return 1
  cc -shared -fPIC -O2 -U_FORTIFY_SOURCE -o target/hull-test-preload.so "$fixture/preload.c" &&
    python3 "$fixture/make.py" "$rootfs_tar" target/hull-test-preload.so "$hostile_tar.partial" &&
    mv "$hostile_tar.partial" "$hostile_tar"
}
printf 'version = 1\n[vm]\nrootfs = "%s"\n' "$hostile_tar" >target/vm-rootfs.toml
# The images depend on nothing the native tests do, and the native tests
# use no image: the images are built (or found cached) in the background
# while the native tests run, from a copy of this build's hull (the native
# tests rebuild nothing, but a copy cannot change under the builds). The
# tests' userland first, beside the rootfs tarball (an mmdebstrap on the
# host): the userland's container (npm's few hundred packages, two minutes
# of mmdebstrap on the host) is made while the guest's own system is (the
# cache's bases/). Then the guest image beside the rootfs tarball's image,
# which copy that system instead of making it again. Measured from an
# empty cache on a 2-core machine, this order and the guest image first
# end alike (the native tests waited 118-124 s for the images against
# 102-114 s; whole suite 19 min 10 s and 20 min 10 s against 19 min 39 s
# to 20 min 49 s): the images' time is their boots under TCG beside
# clippy and the native tests, whatever their order. The userland built
# beside the guest image, each making its own container, ended no sooner
# and slowed those by 2 minutes. Their output is shown after the native
# tests, their steps are in the summary.
build_images() {
  local hull=target/images-hull
  cp target/debug/hull "$hull" || return 1
  (
    names=() secs=() results=()
    step "tier-3 rootfs tarball" make_hostile_tar
    record_steps target/images-steps-1.tsv
  ) >target/images-tarball.log 2>&1 &
  local tarball_pid=$!
  step "tier-3 userland image" timeout 1800 "$hull" image build \
    --policy tests/fixtures/vm-userland.toml
  record_steps target/images-steps-2.tsv
  (
    names=() secs=() results=()
    step "tier-3 guest image" timeout 1800 "$hull" image build
    record_steps target/images-steps-3.tsv
  ) >target/images-guest.log 2>&1 &
  wait "$tarball_pid"
  cat target/images-tarball.log
  names=() secs=() results=()
  step "tier-3 rootfs image" timeout 1800 "$hull" image build --policy target/vm-rootfs.toml
  record_steps target/images-steps-4.tsv
  wait
  cat target/images-guest.log
}
images_log=target/images.log
rm -f target/images-steps-*.tsv
printf '\n==> tier-3 images (in the background beside the native tests: %s)\n' "$images_log" >&2
(names=() secs=() results=() failed=0 && HULL_AGENT="$agent" build_images) >"$images_log" 2>&1 &
images_pid=$!

# Clippy while the images build too (it needs no image).
step "clippy (Linux)" cargo clippy --workspace --all-targets --locked --features "$FEATURES" -- -D warnings
for target in aarch64-apple-darwin x86_64-pc-windows-gnu; do
  step "clippy ($target)" cargo clippy --workspace --all-targets --locked --target "$target" -- -D warnings
done

# The VM tests are the `vm` test group of .config/nextest.toml.
# Root runs the tests ignored for needing root too; `helper_process` is not
# a test but a process the runtime tests start.
root_args=()
if [ "$(id -u)" -eq 0 ]; then
  root_args=(--run-ignored all)
fi
step "native tests" nextest_run junit-native.xml "${root_args[@]}" \
  -E 'not group(vm) & not test(=runtime::tests::helper_process)'

# The images the tier-3 tests need: wait for the background builds.
t0=$(date +%s)
wait "$images_pid"
printf '\n==> tier-3 images (waited %ss after the native tests)\n' $(($(date +%s) - t0)) >&2
cat "$images_log" >&2
for n in 1 2 3 4; do
  merge_steps "target/images-steps-$n.tsv" "tier-3 images ($n/4)" "$images_log"
done

export HULL_AGENT="$agent"
step "tier-3 tests" nextest_run junit-tier3.xml -E 'group(vm)'

step "doc tests" timeout 600 cargo test --doc --workspace --locked "${NO_DEFAULT[@]}" --features "$FEATURES"

exit "$failed"
