# Shared by perf/run.sh and perf/instructions.sh (sourced, not run): installs wrk and oha
# when missing, builds the release binaries, starts tidegate-mock on a random loopback
# port, and writes a one-connection Tidegate config in front of it. Every process started
# is recorded in `pids` and ended by PID on exit.

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
OHA=$(command -v oha || echo /opt/oha/bin/oha)
[ -x "$OHA" ] || { cargo install oha --locked --root /opt/oha -q; OHA=/opt/oha/bin/oha; }
. perf/binaries.sh   # $BIN (TIDEGATE_BIN=DIR: prebuilt), pids, cleanup

start_mock "$BIN" "$OUT/mock.log"; MOCK_PORT=$STARTED_PORT

# write_config FILE WORKERS PIN: Tidegate in front of that mock (perf/binaries.sh).
write_config() { gateway_config "$1" "$MOCK_PORT" "$2" "$3"; }
