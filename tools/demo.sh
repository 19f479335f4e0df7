#!/usr/bin/env bash
# The demo: build, prepare the fortune corpus (byte-level tokens), train configs/demo.yaml.
# Extra arguments are passed to `tripod train` as overrides, e.g. training.train_iters=50.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/blas_env.sh
. tools/blas_env.sh
tools/build.sh build
tools/prepare_demo.sh build data/fortunes
./build/tripod train configs/demo.yaml "$@"
