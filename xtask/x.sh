#!/usr/bin/env bash
# The one entry point on a fresh machine: makes sure the pinned stable toolchain exists (even with
# an empty RUSTUP_HOME, and with RUSTUP_AUTO_INSTALL=0), then hands over to `cargo xtask`, which
# installs everything else it needs (nightly + rust-src, bpf-linker, Debian packages).
#   xtask/x.sh run    build and start the agent on this host
#   xtask/x.sh test   run every test tier
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The value of key $1 in toolchains.env (the pin file; xtask and the agent's build.rs read it too):
# the rest of the one line starting with `$1=`, which must be non-empty [A-Za-z0-9._-].
pin() {
  local line value count=0
  while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line == "$1="* ]]; then
      value=${line#"$1="}
      count=$((count + 1))
    fi
  done <toolchains.env
  if [[ $count -ne 1 || ! ${value:-} =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "error: toolchains.env needs exactly one line $1=<version> ([A-Za-z0-9._-] only)" >&2
    return 1
  fi
  printf '%s\n' "$value"
}
STABLE=$(pin RUST_STABLE)
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
