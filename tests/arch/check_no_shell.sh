#!/usr/bin/env bash
# No code hands a command line to a shell. Usage: check_no_shell.sh SOURCE_ROOT
#                                               check_no_shell.sh --self-test
#
# Fails, listing each call, when a C or C++ file under base, kernels, parallel, engine,
# tools or tests calls system() or popen(): a shell reads their string, so a quote or ';'
# in a path inside it runs a command. Programs run through tpd_spawn_run or
# tpd_spawn_capture (base/spawn.h) with an argument vector instead.
# --self-test plants each call in a scratch tree and fails unless both are caught, so this
# check can itself fail.
set -uo pipefail

check_tree() {
    local root=$1 bad=0 f hits
    cd "$root" || return 2
    while IFS= read -r f; do
        # a call: the name not preceded by a letter, digit, '_', '.' or '>' (a member or
        # a prefixed name), then '('; comment lines are skipped
        hits=$(grep -nE '(^|[^_[:alnum:]>.])(system|popen)[[:space:]]*\(' "$f" |
               grep -vE '^[0-9]+:[[:space:]]*(/?\*|//)' || true)
        if [[ -n $hits ]]; then
            echo "$f: runs a shell (use tpd_spawn_run, base/spawn.h): $hits"
            bad=1
        fi
    done < <(find base kernels parallel engine tools tests -type f \
                  \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) \
                  2>/dev/null | sort)
    return $bad
}

self_test() {
    local tmp fails=0 out
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    for call in 'system("gnuplot x");' 'FILE *p = popen(cmd, "r");'; do
        rm -rf "${tmp:?}"/*
        mkdir -p "$tmp/engine/train"
        printf 'void f(void) { %s }\n' "$call" >"$tmp/engine/train/x.c"
        out=$(check_tree "$tmp")
        if [[ $? -eq 0 || $out != *"runs a shell"* ]]; then
            echo "self-test: not caught: $call"
            fails=$((fails + 1))
        fi
    done
    rm -rf "${tmp:?}"/*
    mkdir -p "$tmp/tests/base"
    printf '// system() is not called here\nint tpd_system_ok(void);\nint x = s.system(1);\n' \
        >"$tmp/tests/base/t.cc"
    if ! check_tree "$tmp" >/dev/null; then
        echo "self-test: a clean tree was rejected"
        fails=$((fails + 1))
    fi
    ((fails == 0)) && echo "self-test: every planted shell call was caught"
    return $((fails > 0))
}

if [[ ${1:-} == --self-test ]]; then
    self_test
    exit $?
fi
root=${1:?usage: check_no_shell.sh SOURCE_ROOT | --self-test}
if check_tree "$root"; then
    echo "no shell: no system() or popen() anywhere in the tree"
    exit 0
fi
exit 1
