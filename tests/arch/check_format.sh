#!/usr/bin/env bash
# Layout is clang-format's business (.clang-format at the root), so reviews never discuss
# it. Usage: check_format.sh SOURCE_ROOT. Fails listing every C, C++ and CUDA file whose
# layout differs from what clang-format 14 (Debian 12's, installed by tools/setup.sh)
# writes; `clang-format -i FILE` fixes one. Skips (exit 77) where that version is absent,
# since another version lays some constructs out differently.
set -uo pipefail
root=${1:?usage: check_format.sh SOURCE_ROOT}
cd "$root" || exit 2
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $cf ]]; then
    echo "check_format: clang-format is not installed (tools/setup.sh installs it): skipped"
    exit 77
fi
version=$("$cf" --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1)
if [[ ${version%%.*} != 14 ]]; then
    echo "check_format: clang-format $version found; the tree is laid out by clang-format 14: skipped"
    exit 77
fi
bad=0
while IFS= read -r f; do
    if ! "$cf" --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "check_format: $f is not formatted (clang-format -i $f)"
        bad=$((bad + 1))
    fi
done < <(find base kernels parallel engine tests -type f \
              \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort)
if ((bad > 0)); then
    echo "check_format: $bad file(s) to format"
    exit 1
fi
echo "check_format: every C, C++ and CUDA file is formatted (clang-format $version)"
