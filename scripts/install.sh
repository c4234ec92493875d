#!/usr/bin/env bash
# Installs Tidegate as a systemd service: the binary to /usr/local/bin, the shipped config to
# /etc/tidegate/ (an existing one is never overwritten), an env file for provider keys, the
# unit, and the `tidegate` system user. Idempotent: run it again to upgrade the binary.
#
#   scripts/install.sh [--root DIR] [--binary PATH]
#   scripts/install.sh --uninstall [--root DIR]
#
# --root DIR     install under DIR and skip useradd/chown/systemctl (packaging, tests)
# --binary PATH  install this binary instead of building with `cargo build --release`
# --uninstall    remove the binary and the unit; keep /etc/tidegate and /var/lib/tidegate
set -euo pipefail

root=""
binary=""
uninstall=0
while (($#)); do
    case "$1" in
        --root|--binary)
            if (($# < 2)) || [[ -z "$2" || "$2" == -* ]]; then
                echo "install.sh: $1 needs a value (see --help)" >&2
                exit 2
            fi
            if [[ "$1" == --root ]]; then root="$2"; else binary="$2"; fi
            shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "$root" ]]; then
    mkdir -p "$root"
    root="$(cd "$root" && pwd)"
    system=0
else
    system=1
    if [[ $EUID -ne 0 ]]; then
        echo "install.sh: run as root (or use --root DIR)" >&2
        exit 1
    fi
fi
bin="$root/usr/local/bin/tidegate"
etc="$root/etc/tidegate"
unit="$root/etc/systemd/system/tidegate.service"

if ((uninstall)); then
    if ((system)) && command -v systemctl >/dev/null; then
        systemctl disable --now tidegate.service 2>/dev/null || true
    fi
    rm -f "$bin" "$unit"
    if ((system)) && command -v systemctl >/dev/null; then
        systemctl daemon-reload
    fi
    echo "removed $bin and $unit; kept $etc (config, keys) and the state directory"
    exit 0
fi

if [[ -z "$binary" ]]; then
    (cd "$repo" && cargo build --release --locked)
    binary="$repo/target/release/tidegate"
fi
[[ -x "$binary" ]] || { echo "install.sh: $binary is not an executable" >&2; exit 1; }

install -D -m 0755 "$binary" "$bin"
install -D -m 0644 "$repo/scripts/tidegate.service" "$unit"
install -d -m 0750 "$etc"
if [[ -e "$etc/tidegate.toml" ]]; then
    echo "keeping the existing $etc/tidegate.toml"
else
    install -m 0640 "$repo/config/tidegate.toml" "$etc/tidegate.toml"
fi
if [[ ! -e "$etc/env" ]]; then
    umask 077
    cat >"$etc/env" <<'ENV'
# Provider keys for the tidegate service (systemd EnvironmentFile), one NAME=value per line.
# OPENAI_API_KEY=sk-...
# ANTHROPIC_API_KEY=sk-ant-...
# OPENROUTER_API_KEY=sk-or-...
ENV
    chmod 0600 "$etc/env"
fi

if ((system)); then
    if ! id -u tidegate >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/tidegate --no-create-home \
            --shell /usr/sbin/nologin tidegate
    fi
    chown root:tidegate "$etc" "$etc/tidegate.toml"
    if command -v systemctl >/dev/null; then
        systemctl daemon-reload
        if systemctl is-active --quiet tidegate.service; then
            echo "restart to run the new binary: systemctl restart tidegate"
        fi
    fi
fi
"$bin" check --config "$etc/tidegate.toml" || true
echo "installed $bin, $unit and $etc; start with: systemctl enable --now tidegate"
