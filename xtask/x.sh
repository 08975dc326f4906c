#!/usr/bin/env bash
# The one entry point on a fresh machine: makes sure the pinned stable toolchain exists (even with
# an empty RUSTUP_HOME, and with RUSTUP_AUTO_INSTALL=0), then hands over to `cargo xtask`, which
# installs everything else it needs (nightly + rust-src, bpf-linker, Debian packages).
#   xtask/x.sh run    build and start the agent on this host
#   xtask/x.sh test   run every test tier
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Keep in step with STABLE in xtask/src/toolchain.rs.
STABLE=1.95.0
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

if ! command -v rustup >/dev/null 2>&1; then
  echo "error: rustup is not on PATH; install rustup first (it manages the pinned toolchains)" >&2
  exit 1
fi
if ! rustup run "$STABLE" rustc --version >/dev/null 2>&1; then
  echo "xtask: installing Rust $STABLE (minimal profile)" >&2
  rustup toolchain install "$STABLE" --profile minimal --no-self-update >&2
fi
exec cargo "+$STABLE" xtask "$@"
