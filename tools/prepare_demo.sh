#!/usr/bin/env bash
# Prepares the demo corpus: the English fortunes of Debian's `fortunes` package, one
# document per fortune, byte-level tokens, as a Megatron indexed data set.
#
# usage: tools/prepare_demo.sh [BUILD_DIR] [OUT_PREFIX]
#   BUILD_DIR   where the `tripod` binary is (default: build)
#   OUT_PREFIX  output prefix; writes OUT_PREFIX.idx and OUT_PREFIX.bin
#               (default: data/fortunes)
# Relative paths are taken from the repository root. Does nothing when the output
# exists and is newer than every input.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build_dir=${1:-build}
out=${2:-data/fortunes}
fortune_dir=${FORTUNE_DIR:-/usr/share/games/fortunes}
tripod="$build_dir/tripod"

if [[ ! -d "$fortune_dir" ]]; then
    echo "prepare_demo: $fortune_dir not found: the fortunes package is missing;" \
         "install it with tools/setup.sh" >&2
    exit 1
fi

# The directory holds, per collection, the text file NAME, its strfile index NAME.dat
# (binary) and NAME.u8, a symlink to NAME. Keep the regular text files only, in a fixed
# order so that the data set is the same on every machine.
inputs=()
while IFS= read -r -d '' f; do
    case "$f" in *.dat | *.u8) continue ;; esac
    [[ -L "$f" || ! -f "$f" ]] && continue
    grep -Iq . "$f" || continue # empty, or binary: not text
    inputs+=("$f")
done < <(find "$fortune_dir" -maxdepth 1 -mindepth 1 -print0 | LC_ALL=C sort -z)

if [[ ${#inputs[@]} -eq 0 ]]; then
    echo "prepare_demo: no fortune text files in $fortune_dir;" \
         "install the fortunes package with tools/setup.sh" >&2
    exit 1
fi

if [[ -f "$out.idx" && -f "$out.bin" ]]; then
    stale=0
    for f in "${inputs[@]}"; do
        if [[ "$f" -nt "$out.idx" || "$f" -nt "$out.bin" ]]; then
            stale=1
            break
        fi
    done
    if [[ $stale -eq 0 ]]; then
        echo "prepare_demo: $out.idx and $out.bin are up to date"
        exit 0
    fi
fi

if [[ ! -x "$tripod" ]]; then
    echo "prepare_demo: $tripod not found; build it first" \
         "(cmake -S . -B $build_dir && cmake --build $build_dir --target tripod)" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
echo "prepare_demo: ${#inputs[@]} fortune files from $fortune_dir -> $out"
"$tripod" data prepare --input "${inputs[@]}" --output "$out" --records percent --force
