#!/usr/bin/env bash
# The demo: build, prepare the fortune corpus (byte-level tokens), train configs/demo.yaml,
# then sample text from the trained model.
# Extra arguments are passed to `tripod train` as overrides, e.g. training.train_iters=50.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh build
tools/prepare_demo.sh build data/fortunes
# The demo trains from scratch each time: a rerun replaces its own runs/demo/ckpt and
# runs/demo/metrics.jsonl, which a run refuses unless told (checkpoint.overwrite,
# logging.overwrite).
./build/tripod train configs/demo.yaml checkpoint.overwrite=true logging.overwrite=true "$@"
echo
echo "== sampling from the trained model: build/tripod generate runs/demo/ckpt --prompt 'The '"
./build/tripod generate runs/demo/ckpt --prompt "The " --max-new-tokens 300 --temperature 0.8 \
  --top-k 20 --seed 7
echo
