#!/bin/sh
# After a failed ctest run: each failed test's FAIL lines and its last lines, from BUILD's LastTest.log, printed last.
# A long run's log is often read from its end (a CI page keeps the head and the tail): the reasons belong there too.
# usage: failed-tests.sh BUILD
log=$1/Testing/Temporary/LastTest.log
[ -r "$log" ] || { echo "failed-tests.sh: no $log"; exit 0; }
echo
echo "==== the failed tests' reasons (from $log) ===="
awk '
    / Testing: / { name = $3; n = 0; inside = 0; next }
    /^Output:$/ { inside = 1; getline; next }
    /^<end of output>$/ { inside = 0; next }
    inside { out[n++] = $0; next }
    /^Test Failed\.|^Test time .*Timeout|^Test Timeout/ {
        print "---- " name
        for (i = 0; i < n; i++) if (out[i] ~ /FAIL/) print out[i]
        print "  (its last lines:)"
        for (i = (n > 12 ? n - 12 : 0); i < n; i++) print "  " out[i]
    }' "$log"
