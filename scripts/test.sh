#!/usr/bin/env bash
# Sets up what is missing, then runs every check and test of hull:
# format, clippy (Linux, macOS and Windows targets), unit and golden tests,
# the escape matrix on every Linux tier, and the tier-3 VM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

bash scripts/setup.sh --tier3

step() { printf '\n==> %s\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "clippy (Linux)"
cargo clippy --workspace --all-targets --locked -- -D warnings
for target in aarch64-apple-darwin x86_64-pc-windows-gnu; do
  step "clippy ($target)"
  cargo clippy -p hull -p hull-protocol --all-targets --locked --target "$target" -- -D warnings
done

step "build"
cargo build --workspace --locked

# Tier 3 needs the guest image built for this recipe and this hull-agent
# (cached under ~/.cache/hull/images by hash: rebuilt only when either changed;
# the only network use is the Debian mirror during the build).
step "tier-3 guest image"
target/debug/hull image build

step "tests (unit, golden, escape matrix on landlock and bwrap, tier-3 VM tests)"
cargo test --workspace --locked

step "escape matrix on tier 3"
cargo test -p hull-tests --locked --features tier3 vm:: -- --test-threads=2

step "tier-3 image contract (boots the image by hand, configures, runs, checks both ways)"
HULL_AGENT="$PWD/target/debug/hull-agent" cargo test -p hull --locked --test tier3_image -- --ignored
