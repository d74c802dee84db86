#!/usr/bin/env bash
# Sets up what is missing, builds hull and the tier-3 guest image (cached
# after the first time), then runs a sample command under tier 3: an outer
# QEMU VM (KVM when it works, else TCG emulation) running an unprivileged
# Incus container, with this repository as the project.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

bash scripts/setup.sh --tier3
cargo build --release --locked -p hull
# The agent is the container's init: static, so it loads nothing of the
# container's userland.
cargo build --release --locked -p hull-agent --target x86_64-unknown-linux-musl
HULL=target/release/hull
export HULL_AGENT="$PWD/target/x86_64-unknown-linux-musl/release/hull-agent"

$HULL probe
$HULL image build
echo
echo "==> hull run --tier3 -- sh -c '...'"
$HULL run --tier3 --project "$PWD" -- sh -c 'echo "hello from $(uname -n): uid $(id -u), kernel $(uname -r)"; ls README.md; cat /proc/1/cgroup | head -1'
