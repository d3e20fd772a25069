# Sourced by the fine-tuning equivalence scripts (LoRA, SFT, DPO): a scratch directory removed on exit, the counters,
# and the checks they share. A script sets DTRAIN, and common=(the flags every training run of run() takes) before
# it runs one.
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"   # the directory, the counters, field, gpl_tokens
# the tokenized rows cached in the scratch directory, not the user's: rows cached by an earlier build (or a run with a
# bug planted) would answer a refusal's check without the file being read (CI failed so once, a Latin-1 line taken)
export XDG_CACHE_HOME=$dir/cache
verdict() { # OK WHAT
    if [ "$1" = 1 ]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi
}
# The worst relative difference of two metrics files' losses over 20 steps ("missing": not 20 in each): checks.sh's
# for the loss.
worst() { # REF FILE
    paste <(field loss "$1") <(field loss "$2") |
        awk 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=20) print "missing"; else print w}'
}
close() { # WHAT REF FILE [TOL]: within TOL (1e-6) relative at every step
    local w tol=${4:-1e-6}
    w=$(worst "$2" "$3")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= $tol)}" && ok=1 || ok=0
    verdict $ok "$1: worst relative loss difference over 20 steps $w${4:+ (held to $tol)}"
}
# One training run ("$DTRAIN" train "${common[@]}" --quiet ARGS) with its metrics in $dir/NAME.jsonl.
run() { # NAME ARGS...
    local name=$1
    shift
    "$DTRAIN" train "${common[@]}" --quiet "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
        { failed=$((failed + 1)); echo "FAIL $name: $*"; tail -3 "$dir/$name.out"; return 1; }
}
# "$DTRAIN" ARGS fails, saying NEEDLE.
refused() { # WHAT NEEDLE ARGS...
    local what=$1 needle=$2
    shift 2
    "$DTRAIN" "$@" > "$dir/refused.out" 2>&1
    [ $? != 0 ] && grep -q -- "$needle" "$dir/refused.out" && ok=1 || ok=0
    verdict $ok "refused: $what ($(grep -m1 error "$dir/refused.out" | cut -c1-150))"
}
# A 2-rank run ("$DTRAIN" train ARGS, 100000 steps) whose rank 1 is killed once it steps: the job must end naming it
# (rank 0 says it in a collective, or the launcher where it stopped rank 0 first: issue 58's race on a busy machine);
# the time is said, not held to (load moves it).
killed_rank() { # WHAT ARGS...
    local what=$1
    shift
    # the last call's output gone first: the loop below could read its "step" lines before this job's shell truncates
    # the file, and look for rank 1 before the launcher started it (it failed so once, beside a benchmark)
    rm -f "$dir/kout" "$dir/kerr"
    "$DTRAIN" train "$@" --steps 100000 > "$dir/kout" 2> "$dir/kerr" &
    local launcher=$! victim="" i p
    # its first step printed: up to a minute (a sanitizer's build on a busy machine took more than the 10 s once given)
    for ((i = 0; i < 600; i++)); do grep -q "^step" "$dir/kout" 2>/dev/null && break; sleep 0.1; done
    for p in $(pgrep -P $launcher); do grep -qz '^DTRAIN_RANK=1$' /proc/$p/environ 2>/dev/null && victim=$p; done
    if [ -z "$victim" ]; then
        kill $launcher; failed=$((failed + 1)); echo "FAIL $what: rank 1 not found"
        return
    fi
    local t0 rc secs said
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait $launcher
    rc=$? secs=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
    said=$(grep -m1 "rank 0.*rank 1 (pid $victim)" "$dir/kerr" || grep -m1 "launch: rank 1 (pid $victim) was killed" "$dir/kerr")
    [ $rc != 0 ] && [ -n "$said" ] && ok=1 || ok=0
    verdict $ok "$what: the job ended in $secs s naming it ($(echo "$said" | cut -c1-120))"
}
