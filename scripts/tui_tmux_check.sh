#!/usr/bin/env bash
# A real-terminal run of `fuselens tui` under tmux: the app starts, shows the
# kernels of an example, applies a toggle (Inductor max fusion size 64 -> 2,
# which recompiles and re-profiles in the kept worker) and quits cleanly.
#
#   scripts/tui_tmux_check.sh [EXAMPLE.py] [BACKEND]
#
# Defaults: a small sin/cos program written to a temp dir, backend inductor.
# Exit 0 on success; on failure prints the last screen and exits 1.
# tests/test_tui_tmux.py runs this (marked slow: an Inductor compile here
# takes ~20 s).
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$(mktemp -d -t fuselens-tui-tmux.XXXXXX)"
SESSION="fuselens-tui-check-$$"
EXAMPLE="${1:-}"
BACKEND="${2:-inductor}"
PY="${PYTHON:-python}"
STEP_TIMEOUT="${TUI_CHECK_TIMEOUT:-240}"

cleanup() {
    tmux kill-session -t "$SESSION" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ -z "$EXAMPLE" ]; then
    EXAMPLE="$WORK/example.py"
    cat >"$EXAMPLE" <<'EOF'
import torch

def f(x):
    y = torch.sin(x) * 2 + torch.cos(x)
    return y.sum()

cf = torch.compile(f)
x = torch.randn(256, 256)
for _ in range(5):
    cf(x)
EOF
fi

screen() { tmux capture-pane -p -t "$SESSION" 2>/dev/null; }

fail() {
    echo "FAIL: $*" >&2
    echo "---- last screen ----" >&2
    screen >&2
    exit 1
}

# wait_for REGEX WHAT: poll the pane until REGEX shows up.
wait_for() {
    local deadline=$((SECONDS + STEP_TIMEOUT))
    until screen | grep -Eq "$1"; do
        [ $SECONDS -ge $deadline ] && fail "no '$2' on screen after ${STEP_TIMEOUT}s"
        tmux has-session -t "$SESSION" 2>/dev/null || fail "the app exited early ($2)"
        sleep 0.5
    done
    echo "ok: $2"
}

tmux new-session -d -s "$SESSION" -x 160 -y 45 \
    "cd '$REPO' && $PY -m fuselens tui --backend '$BACKEND' --no-sample --export-dir '$WORK' '$EXAMPLE'; echo \$? >'$WORK/exit-code'; sleep 30" \
    || fail "tmux could not start"

wait_for "toggles" "the app started"
wait_for "run 1 done" "the first profile finished"
wait_for "cpp_fused|triton_|kernel" "kernels of the example in the table"
screen | grep -Eq "cpp_fused|triton_(poi|red|per)" || fail "no generated kernel in the table"

# Toggles panel, down to Inductor's max fusion size, one step left: 64 -> 2. Its row
# is counted from the toggles list itself (the section headers take no Down): a count
# written here went stale when compiler options were added.
downs="$(cd "$REPO" && $PY -c 'from fuselens.tui.toggles import TOGGLES
print([t.key for t in TOGGLES].index("inductor:max_fusion_size"))')" || fail "could not count the toggles"
tmux send-keys -t "$SESSION" t
sleep 0.3
for _ in $(seq "$downs"); do tmux send-keys -t "$SESSION" Down; sleep 0.05; done
tmux send-keys -t "$SESSION" Left
wait_for "max_fusion_size=2" "the toggle started a re-run"
wait_for "run 2 done" "the re-run finished"
wait_for "(new|gone|[+−±][0-9.]+ (µs|ms|s))" "the table compares with the previous run"
[ -n "${TUI_CHECK_SHOW:-}" ] && screen

tmux send-keys -t "$SESSION" q
deadline=$((SECONDS + 20))
until [ -f "$WORK/exit-code" ]; do
    [ $SECONDS -ge $deadline ] && fail "the app did not quit on q"
    sleep 0.2
done
code="$(cat "$WORK/exit-code")"
[ "$code" = "0" ] || fail "fuselens tui exited with $code"
echo "ok: quit cleanly (exit 0)"
echo "PASS"
