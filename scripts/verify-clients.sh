#!/usr/bin/env bash
# Runs real coding clients against a Tidegate it starts, and checks each one's answer:
#   Claude Code (npm @anthropic-ai/claude-code)  `claude -p`     on /v1/messages
#   Codex CLI   (npm @openai/codex)              `codex exec`    on /v1/responses
#   aider       (PyPI aider-chat, in a venv)     `aider --message` on /v1/chat/completions
#
# Usage: scripts/verify-clients.sh [claude] [codex] [aider]     (default: all three)
#
# Each client is installed once into a cache directory (pinned versions, below) and run
# non-interactively with a throw-away HOME, so no user config or login is read. Every run
# goes to the gateway on 127.0.0.1 (port 0) and from there either to the in-process mock
# provider (`mock/echo`) or to `tidegate-mock` on 127.0.0.1 (port 0) as an Anthropic-format
# provider, an OpenAI-format provider, and an OpenAI-format provider that speaks only Chat
# Completions, so the client's requests are forwarded as they are or translated. The mock
# answers with the last user message, so the prompt's marker in the client's answer, and
# a status-200 access-log line for the run's model, show the round trip. Claude Code and
# Codex also run one tool round trip each through an Anthropic-format and an OpenAI
# (Chat Completions) provider served by scripts/verify_clients_upstream.py: the model has
# the client run `echo <marker>-tool` and answers with the tool's output. Codex runs with
# its default tools but the hosted web search, and (models `…/agent`) also has its
# multi-agent `close_agent` called through the gateway's flattened namespace tool.
#
# A client whose install fails is skipped with a message (no registry reachable, say);
# a client that runs and fails makes the script exit 1. The gateway's access log and each
# client's output are kept in the work directory printed at the end (deleted on success
# unless KEEP=1).
#
# Environment:
#   TIDEGATE_BIN=DIR              tidegate and tidegate-mock from DIR (default: a debug
#                                 build, `cargo build --bins` first)
#   TIDEGATE_CLIENTS_CACHE=DIR    install cache (default ~/.cache/tidegate-verify-clients)
#   CLAUDE_CODE_VERSION, CODEX_VERSION, AIDER_VERSION   versions to install (pins below)
#   CLIENT_TIMEOUT_S=120          one client run's limit
#   KEEP=1                        keep the work directory
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.197}
CODEX_VERSION=${CODEX_VERSION:-0.171.0}
AIDER_VERSION=${AIDER_VERSION:-0.86.2}
CLIENT_TIMEOUT_S=${CLIENT_TIMEOUT_S:-120}
cache=${TIDEGATE_CLIENTS_CACHE:-${HOME}/.cache/tidegate-verify-clients}

clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(claude codex aider)
for c in "${clients[@]}"; do
    case $c in claude | codex | aider) ;; *)
        echo "verify-clients: unknown client '$c' (claude, codex, aider)" >&2
        exit 2
        ;;
    esac
done

if [ -z "${TIDEGATE_BIN:-}" ]; then
    cargo build --bins -q
fi
bin=${TIDEGATE_BIN:-${CARGO_TARGET_DIR:-target}/debug}
for b in tidegate tidegate-mock; do
    [ -x "$bin/$b" ] || { echo "verify-clients: no $bin/$b" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-verify-clients.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Reads "<name> listening on ADDR" from FILE (the process's stdout), 30 s at most.
listening_addr() {
    local file=$1 i
    for i in $(seq 300); do
        if grep -q 'listening on ' "$file" 2>/dev/null; then
            sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$file" | head -1
            return 0
        fi
        sleep 0.1
    done
    echo "verify-clients: no 'listening on' line in $file" >&2
    cat "$file" >&2
    return 1
}

# --- installs ---------------------------------------------------------------------------

mkdir -p "$cache"
declare -A version skip

install_npm() { # NAME PACKAGE VERSION BIN
    local name=$1 pkg=$2 want=$3 exe=$4 dir="$cache/npm-$1" got
    got=$("$dir/node_modules/.bin/$exe" --version 2>/dev/null || true)
    if [[ "$got" != *"$want"* ]]; then
        echo "verify-clients: installing $pkg@$want into $dir" >&2
        if ! command -v npm >/dev/null; then
            skip[$name]="npm is not installed"
            return 0
        fi
        if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
            "$pkg@$want" >"$cache/install-$name.log" 2>&1; then
            skip[$name]="npm install $pkg@$want failed (log: $cache/install-$name.log)"
            return 0
        fi
        got=$("$dir/node_modules/.bin/$exe" --version 2>&1 || true)
        if [[ "$got" != *"$want"* ]]; then
            skip[$name]="$pkg@$want installed but \`$exe --version\` says: $got"
            return 0
        fi
    fi
    version[$name]=$got
}

install_aider() {
    local dir="$cache/aider-venv" want=$AIDER_VERSION got
    got=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("aider-chat"))' 2>/dev/null || true)
    if [[ "$got" != "$want" ]]; then
        echo "verify-clients: installing aider-chat==$want into $dir" >&2
        if ! { python3 -m venv --clear "$dir" &&
            "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
                "aider-chat==$want"; } >"$cache/install-aider.log" 2>&1; then
            skip[aider]="pip install aider-chat==$want failed (log: $cache/install-aider.log)"
            return 0
        fi
        got=$want
    fi
    version[aider]="aider $got"
}

for c in "${clients[@]}"; do
    case $c in
        claude) install_npm claude @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude ;;
        codex) install_npm codex @openai/codex "$CODEX_VERSION" codex ;;
        aider) install_aider ;;
    esac
done

# --- the gateway and the upstream ------------------------------------------------------

"$bin/tidegate-mock" --listen 127.0.0.1:0 --workers 1 >"$work/mock.out" 2>&1 &
pids+=($!)
upstream=$(listening_addr "$work/mock.out")

python3 scripts/verify_clients_upstream.py >"$work/tool-upstream.out" 2>&1 &
pids+=($!)
tool_upstream=$(listening_addr "$work/tool-upstream.out")

key="verify-$RANDOM$RANDOM"
cat >"$work/tidegate.toml" <<EOF
[server]
listen = "127.0.0.1:0"
workers = 1
state_dir = "$work/state"

[[client_keys]]
id = "verify"
key = "$key"

[[providers]]
id = "mock"
format = "mock"

[[providers]]
id = "up-anthropic"
format = "anthropic"
base_url = "http://$upstream/v1"

[[providers]]
id = "up-openai"
format = "openai"
base_url = "http://$upstream/v1"

[[providers]]
id = "up-chat"
format = "openai"
base_url = "http://$upstream/v1"
responses_api = false

# The scripted tool round trip (scripts/verify_clients_upstream.py): Chat Completions and
# Messages only, so Codex's Responses requests to either are translated.
[[providers]]
id = "tool-openai"
format = "openai"
base_url = "http://$tool_upstream/v1"
responses_api = false

[[providers]]
id = "tool-anthropic"
format = "anthropic"
base_url = "http://$tool_upstream/v1"

[[connections]]
id = "tool-openai-1"
provider = "tool-openai"
api_key_env = "VERIFY_UPSTREAM_KEY"

[[connections]]
id = "tool-anthropic-1"
provider = "tool-anthropic"
api_key_env = "VERIFY_UPSTREAM_KEY"

[[connections]]
id = "mock-1"
provider = "mock"

[[connections]]
id = "up-anthropic-1"
provider = "up-anthropic"
api_key_env = "VERIFY_UPSTREAM_KEY"

[[connections]]
id = "up-openai-1"
provider = "up-openai"
api_key_env = "VERIFY_UPSTREAM_KEY"

[[connections]]
id = "up-chat-1"
provider = "up-chat"
api_key_env = "VERIFY_UPSTREAM_KEY"
EOF
VERIFY_UPSTREAM_KEY=upstream-key TIDEGATE_LOG=warn,access=info \
    "$bin/tidegate" serve --config "$work/tidegate.toml" >"$work/gateway.out" 2>"$work/gateway.log" &
pids+=($!)
gateway=$(listening_addr "$work/gateway.out")
echo "verify-clients: gateway on $gateway, upstream tidegate-mock on $upstream, work dir $work" >&2

# --- the runs ---------------------------------------------------------------------------

run_claude() { # MODEL PROMPT HOME
    HOME=$3 ANTHROPIC_BASE_URL="http://$gateway" ANTHROPIC_AUTH_TOKEN="$key" \
        ANTHROPIC_MODEL=$1 ANTHROPIC_SMALL_FAST_MODEL=$1 ANTHROPIC_DEFAULT_HAIKU_MODEL=$1 \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
        timeout "$CLIENT_TIMEOUT_S" "$cache/npm-claude/node_modules/.bin/claude" -p "$2" \
        --allowedTools 'Bash(echo:*)' </dev/null
}

run_codex() { # MODEL PROMPT HOME
    mkdir -p "$3/codex"
    {
        echo "model = \"$1\""
        echo 'model_provider = "tidegate"'
        # The hosted web search runs only on OpenAI's own Responses API, so a translated
        # request cannot offer it: Codex's one setting for that. Everything else is Codex's
        # default (its multi-agent namespace tools are translated).
        case $1 in up-anthropic/* | up-chat/* | tool-*)
            echo 'web_search = "disabled"'
            ;;
        esac
        printf '[model_providers.tidegate]\nname = "Tidegate"\n'
        echo "base_url = \"http://$gateway/v1\""
        printf 'env_key = "TIDEGATE_KEY"\nwire_api = "responses"\n'
    } >"$3/codex/config.toml"
    # No approvals and no sandbox, so a run does not depend on this machine's sandbox support
    # (the only command a model here asks for is the tool round trip's `echo`).
    HOME=$3 CODEX_HOME="$3/codex" TIDEGATE_KEY="$key" \
        timeout "$CLIENT_TIMEOUT_S" "$cache/npm-codex/node_modules/.bin/codex" \
        exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -C "$3" "$2" </dev/null
}

run_aider() { # MODEL PROMPT HOME
    (cd "$3" && HOME=$3 OPENAI_API_BASE="http://$gateway/v1" OPENAI_API_KEY="$key" \
        timeout "$CLIENT_TIMEOUT_S" "$cache/aider-venv/bin/aider" --model "openai/$1" \
        --message "$2" --chat-mode ask --no-git --yes-always --no-check-update \
        --analytics-disable --no-show-model-warnings </dev/null)
}

models_for() {
    case $1 in
        claude) echo mock/echo up-anthropic/echo up-openai/echo tool-anthropic/tool tool-openai/tool ;;
        codex) echo mock/echo up-openai/echo up-anthropic/echo up-chat/echo tool-openai/tool tool-anthropic/tool tool-openai/agent tool-anthropic/agent ;;
        aider) echo mock/echo up-openai/echo up-anthropic/echo ;;
    esac
}

failed=0
n=0
results=()
for c in "${clients[@]}"; do
    if [ -n "${skip[$c]:-}" ]; then
        results+=("SKIP  $c: ${skip[$c]}")
        continue
    fi
    for model in $(models_for "$c"); do
        n=$((n + 1))
        marker="tidegate-check-$c-$n"
        home="$work/home-$n"
        mkdir -p "$home"
        log_before=$(wc -l <"$work/gateway.log")
        start=$(date +%s%N)
        rc=0
        "run_$c" "$model" "Reply with $marker" "$home" >"$work/$c-$n.out" 2>"$work/$c-$n.err" || rc=$?
        ms=$((($(date +%s%N) - start) / 1000000))
        secs="$((ms / 1000)).$((ms % 1000 / 100))"
        # The access line is written as the response ends: give it a moment to land.
        for _ in $(seq 20); do
            lines=$(tail -n +"$((log_before + 1))" "$work/gateway.log" | grep ' access ' || true)
            echo "$lines" | grep -q "model=$model .* status=200 " && break
            [ "$rc" -eq 0 ] || break
            sleep 0.1
        done
        # "METHOD route model status[ error]" per request, counted: what the client sent.
        routes=$(echo "$lines" |
            sed -n 's/.*method="\([A-Z]*\)" route="\([^"]*\)" model=\([^ ]*\) .* status=\([0-9]*\) .* error="\([^"]*\)".*/\1 \2 \3 \4 \5/p' |
            sed 's/ -$//' | sort | uniq -c | awk '{$1=$1; print}' | paste -sd ';' -)
        ok_line=$(echo "$lines" | grep -c "model=$model .* status=200 " || true)
        # A tool model answers with the output of the command it had the client run.
        want=$marker
        case $model in tool-*) want="$marker-tool" ;; esac
        if [ "$rc" -eq 0 ] && grep -q -- "$want" "$work/$c-$n.out" && [ "$ok_line" -gt 0 ]; then
            results+=("ok    ${version[$c]}  $model  ${secs}s  [$routes]")
        else
            failed=1
            results+=("FAIL  ${version[$c]}  $model  exit=$rc  [$routes]  (output: $work/$c-$n.out, $work/$c-$n.err)")
        fi
    done
done

echo
echo "verify-clients: $(date -u +%Y-%m-%d), gateway $("$bin/tidegate" --version 2>/dev/null || echo tidegate)"
printf '  %s\n' "${results[@]}"
trap - EXIT
cleanup
if [ "$failed" -ne 0 ] || [ "${KEEP:-0}" = 1 ]; then
    echo "verify-clients: work directory kept: $work"
else
    rm -rf "$work"
fi
exit "$failed"
