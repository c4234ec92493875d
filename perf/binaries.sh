# Sourced by the perf scripts: picks the release binaries into $BIN and sets up `pids`,
# whose processes are ended by PID on exit.
#   TIDEGATE_BIN=DIR   run prebuilt tidegate + tidegate-mock from DIR (e.g. a copy of an
#                      earlier build), build nothing; BIN_DIR=DIR is the same (older name).
# Otherwise the release binaries are built (fat LTO: slow the first time).
TIDEGATE_BIN=${TIDEGATE_BIN:-${BIN_DIR:-}}
[ -n "$TIDEGATE_BIN" ] || cargo build --release --bins -q
BIN=${TIDEGATE_BIN:-${CARGO_TARGET_DIR:-target}/release}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

. perf/stack.sh   # start_mock, gateway_config, listening_addr
