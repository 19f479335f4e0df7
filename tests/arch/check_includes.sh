#!/usr/bin/env bash
# The architecture as a test. Usage: check_includes.sh SOURCE_ROOT
#                                    check_includes.sh --self-test
#
# Fails (listing every offence) when, anywhere in the tree:
#   - an #include points the wrong way: base <- kernels <- parallel <- engine (a folder
#     includes only itself and the folders to its right in the diagram of README.md's
#     "Layout of the source"), and inside engine/: config <- data <- model <- optim <-
#     trace <- plan <- checkpoint <- train <- bench <- generate <- verify <- cli;
#   - a file includes another folder's *_internal.h (tests/X/ counts as folder X);
#   - a file outside parallel/ includes <mpi.h>;
#   - library code (base, kernels, parallel, engine) ends the process: exit(), _exit() or
#     abort(), except base/fatal.c, the one documented fatal path.
# --self-test plants each kind of offence in a scratch tree and fails unless every one is
# caught, so this check can itself fail.
set -uo pipefail

layers=(base kernels parallel engine)
engine_order=(config data model optim trace plan checkpoint train bench generate verify cli)

index_of() { # index_of NAME LIST... -> index, or -1
    local name=$1 i=0
    shift
    for x in "$@"; do
        [[ $x == "$name" ]] && { echo $i; return; }
        i=$((i + 1))
    done
    echo -1
}

# The folder a path "counts as" for the layering: tests/X/... counts as X/...
owner_path() {
    local p=$1
    [[ $p == tests/* ]] && p=${p#tests/}
    echo "$p"
}

check_tree() {
    local root=$1 bad=0 f line inc
    cd "$root" || return 2
    while IFS= read -r f; do
        local own top sub is_test=0
        [[ $f == tests/* ]] && is_test=1
        own=$(owner_path "$f")
        top=${own%%/*}
        sub=$(echo "$own" | cut -d/ -f2)
        while IFS= read -r line; do
            inc=${line#*\"}
            inc=${inc%%\"*}
            local itop=${inc%%/*} isub
            isub=$(echo "$inc" | cut -d/ -f2)
            # 1. layers (tests may include any public header)
            local fl il
            fl=$(index_of "$top" "${layers[@]}")
            il=$(index_of "$itop" "${layers[@]}")
            if ((is_test == 0 && fl >= 0 && il > fl)); then
                echo "$f: includes \"$inc\": $top/ may not include $itop/ (it sits to the right)"
                bad=1
            fi
            # 2. engine's concept order
            if ((is_test == 0)) && [[ $top == engine && $itop == engine ]]; then
                local fe ie
                fe=$(index_of "$sub" "${engine_order[@]}")
                ie=$(index_of "$isub" "${engine_order[@]}")
                if ((fe >= 0 && ie > fe)); then
                    echo "$f: includes \"$inc\": engine/$sub/ may not include engine/$isub/ (it comes later)"
                    bad=1
                fi
            fi
            # 3. internal headers stay inside their folder (and its test folder)
            if [[ $inc == *_internal.h ]]; then
                local idir=${inc%/*}
                if [[ $own != "$idir"/* ]]; then
                    echo "$f: includes \"$inc\", internal to $idir/"
                    bad=1
                fi
            fi
        done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f")
        # 4. MPI behind comm.h
        if [[ $f != parallel/* ]] && grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<mpi\.h>' "$f"; then
            echo "$f: includes <mpi.h> (only parallel/ may; use parallel/comm.h)"
            bad=1
        fi
        # 5. no process exit in library code
        if ((is_test == 0)) && [[ $top =~ ^(base|kernels|parallel|engine)$ && $f != base/fatal.c ]]; then
            local hits
            hits=$(grep -nE '(^|[^_[:alnum:]>.])(_exit|exit|abort)[[:space:]]*\(' "$f" |
                   grep -vE '^[0-9]+:[[:space:]]*(/?\*|//)' || true)
            if [[ -n $hits ]]; then
                echo "$f: ends the process (call tpd_fatal, base/fatal.h, or return a status): $hits"
                bad=1
            fi
        fi
    done < <(find base kernels parallel engine tests -type f \
                  \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) \
                  2>/dev/null | sort)
    return $bad
}

self_test() {
    local tmp fails=0
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    mkdir -p "$tmp"/{base,kernels,parallel,engine/config,engine/train,engine/checkpoint,tests/engine/train}
    plant() { # plant FILE CONTENT EXPECTED_WORD
        local file=$1 content=$2 word=$3 out
        rm -rf "$tmp"/{base,kernels,parallel,engine,tests}/*
        mkdir -p "$tmp"/{engine/config,engine/train,engine/checkpoint,tests/engine/train}
        mkdir -p "$(dirname "$tmp/$file")"
        printf '%s\n' "$content" >"$tmp/$file"
        out=$(check_tree "$tmp")
        if [[ $? -eq 0 || $out != *"$word"* ]]; then
            echo "self-test: not caught: $file: $content"
            fails=$((fails + 1))
        fi
    }
    plant engine/config/x.c '#include "engine/train/train.h"' "comes later"
    plant kernels/x.c '#include "parallel/comm.h"' "sits to the right"
    plant engine/train/x.c '#include "engine/checkpoint/checkpoint_internal.h"' "internal to"
    plant tests/engine/train/t.cc '#include "engine/checkpoint/checkpoint_internal.h"' "internal to"
    plant engine/train/x.c '#include <mpi.h>' "<mpi.h>"
    plant tests/engine/train/t.cc '#include <mpi.h>' "<mpi.h>"
    plant engine/train/x.c 'void f(void) { exit(1); }' "ends the process"
    plant parallel/x.c 'void f(void) { _exit(3); }' "ends the process"
    plant kernels/x.c 'void f(void) { abort(); }' "ends the process"
    # and a clean tree passes
    rm -rf "$tmp"/{base,kernels,parallel,engine,tests}/*
    mkdir -p "$tmp"/engine/train "$tmp"/tests/engine/checkpoint
    printf '#include "engine/config/config.h"\n#include "parallel/comm.h"\n' >"$tmp/engine/train/ok.c"
    printf '#include "engine/checkpoint/checkpoint_internal.h"\n' >"$tmp/tests/engine/checkpoint/t.cc"
    if ! check_tree "$tmp" >/dev/null; then
        echo "self-test: a clean tree was rejected"
        fails=$((fails + 1))
    fi
    ((fails == 0)) && echo "self-test: every planted offence was caught"
    return $((fails > 0))
}

if [[ ${1:-} == --self-test ]]; then
    self_test
    exit $?
fi
root=${1:?usage: check_includes.sh SOURCE_ROOT | --self-test}
if check_tree "$root"; then
    echo "architecture: every include points the right way; MPI only in parallel/; no exits"
    exit 0
fi
exit 1
