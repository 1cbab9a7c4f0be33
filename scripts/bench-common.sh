# What the accelerator bench scripts (bench-model.sh, bench-fused.sh, bench-dtype.sh) share;
# sourced, not run. Sets `args` (accel-bench's arguments: BENCH_ARGS, else the default set) and
# `refbench` (REFBENCH, else ../shared/refbench); `bench_positional "$@"` sets `preset` and
# `dtype` from the script's arguments [PRESET=small] [DTYPE=float32];
# `bench_workdir NAME` sets `work` (target/bench-NAME); `bench_build` builds accel-bench and
# hunch-ckpt in PROFILE (unless NO_BUILD=1); `bench_checkpoint PRESET` prints the path of a random
# checkpoint of PRESET in $work, generated the first time. `bin` is where the binaries are:
# PROFILE=release (the default) or dev (target/debug: dependencies at opt-level 2 and the math in
# the prebuilt libmlx, so the dev binaries of a warm test build time the model as release does,
# give or take the Rust side's graph building). BIN=DIR takes the binaries from DIR instead (an
# older build to compare with), and builds nothing.

# shellcheck disable=SC2206 # BENCH_ARGS is split into arguments on purpose.
args=(${BENCH_ARGS:---prompt-lens 256 --batches 1,4 --widths 32,64 --reps 3 --warmup 1})
profile="${PROFILE:-release}"
case "$profile" in
  release) bin=target/release ;;
  dev) bin=target/debug ;;
  *) echo "PROFILE must be release or dev, not $profile" >&2; exit 2 ;;
esac
[ -z "${BIN:-}" ] || { bin="$BIN"; NO_BUILD=1; }

refbench="${REFBENCH:-../shared/refbench}"

bench_positional() {
  preset="${1:-small}"
  dtype="${2:-float32}"
}

bench_workdir() {
  work="target/bench-$1"
  mkdir -p "$work"
}

bench_build() {
  [ "${NO_BUILD:-0}" = 1 ] \
    || cargo build --profile "$profile" -q -p hunch-accelerator --bin accel-bench --bin hunch-ckpt
}

bench_checkpoint() {
  local preset="$1"
  local ckpt="$work/$preset"
  if [ ! -f "$ckpt/config.json" ]; then
    "$bin/hunch-ckpt" random --preset "$preset" --layout hf --out "$ckpt" >/dev/null
  fi
  echo "$ckpt"
}
