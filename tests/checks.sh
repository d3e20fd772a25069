# Sourced by the training test scripts: a scratch directory removed on exit,
# and the ok/fail counters every script reports with.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
ok() { echo "ok   $*"; passed=$((passed + 1)); }
