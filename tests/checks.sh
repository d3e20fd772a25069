# Sourced by the training test scripts: a scratch directory removed on exit,
# and the ok/fail counters every script reports with.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
ok() { echo "ok   $*"; passed=$((passed + 1)); }
# A training run the caller's "${common[@]}" --batch 2 ARGS describe is
# refused before any step, with EXPECTED in what it says.
refused() { # WHAT EXPECTED ARGS...
    local what=$1 want=$2
    shift 2
    local out
    out=$("$DTRAIN" train "${common[@]}" --batch 2 "$@" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^step"; then ok "$what refused: $(echo "$out" | grep -- "$want" | head -1)"
    else fail "$what: $(echo "$out" | tail -2)"; fi
}
