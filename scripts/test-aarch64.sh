#!/usr/bin/env bash
# The integer kernels' aarch64 copies tested without ARM hardware: the kernels crate's tests
# cross-built for aarch64-unknown-linux-gnu and run under QEMU's user-mode emulator as three
# CPUs, one for each copy (docs/logit-read.md, "Kernels"):
#
#   cortex-a53   plain NEON      (HUNCH_EXPECT_ISA=neon)
#   neoverse-n1  dotprod (sdot)  (HUNCH_EXPECT_ISA=dotprod)
#   max          i8mm (usdot)    (HUNCH_EXPECT_ISA=i8mm)
#
# Under each, every copy the emulated CPU has is checked bit for bit against the portable one,
# and `the_expected_copy_runs_here` fails unless the run-time detection picked the copy named,
# so a pass proves that copy ran. Installs what it needs (idempotent): Debian's cross linker,
# arm64 C library and qemu-user (apt, as root or through sudo), and the target's Rust std
# (rustup). Prints cargo's summary for each CPU; exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu

if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null \
  || [ ! -e "$sysroot/lib/libc.so.6" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "test-aarch64: installing the cross linker, arm64 libc and qemu-user (apt)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  if ! command -v rustup >/dev/null; then
    # Debian's own Rust (rustc-web) is older than this workspace's toolchain and cannot build
    # it, so only rustup's std will do.
    echo "test-aarch64: rustup is needed to add the $target standard library" >&2
    exit 1
  fi
  echo "test-aarch64: adding the $target standard library (rustup)"
  rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo test --quiet -p hunch-kernels --target "$target" --no-run
failed=()
for pair in cortex-a53:neon neoverse-n1:dotprod max:i8mm; do
  cpu=${pair%%:*}
  isa=${pair#*:}
  echo "test-aarch64: -cpu $cpu, expecting the $isa integer products"
  # HUNCH_CPU_ISA from the caller's environment would cap the choice: the run sets its own.
  log=$(mktemp)
  status=0
  env -u HUNCH_CPU_ISA HUNCH_EXPECT_ISA="$isa" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot -cpu $cpu" \
    cargo test --quiet -p hunch-kernels --target "$target" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$log"
    failed+=("$cpu")
  else
    grep -E "^test result" "$log"
  fi
  rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-aarch64: FAILED under -cpu ${failed[*]}" >&2
  exit 1
fi
echo "test-aarch64: all passed under cortex-a53 (neon), neoverse-n1 (dotprod) and max (i8mm)"
