#!/bin/bash
# docs/cli.md, the full flag reference: every command's --help, as the build
# in BUILD prints it. train_hardening.sh checks that docs/cli.md is current.
# usage: scripts/cli-reference.sh [BUILD_DIR] > docs/cli.md
set -euo pipefail
d=${1:-build}/dtrain
echo "# dtrain's commands and flags"
echo
echo "Each section is what \`dtrain COMMAND --help\` prints (made by \`scripts/cli-reference.sh > docs/cli.md\`)."
for c in "" train eval plan tokenize generate serve rl ckpt plot report launch "bench comm" "bench train" "bench infer" "bench serve" "bench rl"; do
    echo
    echo "## dtrain${c:+ $c}"
    echo
    echo '```'
    # shellcheck disable=SC2086
    "$d" $c --help 2>&1
    echo '```'
done
