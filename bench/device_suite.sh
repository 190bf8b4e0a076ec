#!/usr/bin/env bash
# One prepared call of the device suite on a GPU machine without network (each call <= 300 s by its own
# budget; send call 2 at once after call 1, to the warm machine):
#   bash bench/device_suite.sh 1      the preflight, the limits, the hot paths at GPU sizes, the LM step
#   bash bench/device_suite.sh 2      the preflight, PPO against brax's PPO, the preference loop's seeds
# `python -m jaxweight bench --suite device --plan` prints both calls with their parts and budgets.
# Wheels the machine lacks travel in .whl/ (bench/device_wheels.sh fetches them beforehand); they go
# into /tmp/site, never over the machine's own packages. Without .whl/ the call stops at once.
# Writes under $OUT (else ./device-suite-out): device-suite-call<N>-gpu.json, <part>.log, <part>.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
call="${1:?usage: bash bench/device_suite.sh 1|2 [--size quick|cpu|gpu]}"
shift
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-$PWD/device-suite-out}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "device_suite.sh: the wheels did not install" >&2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null > "$out/nvidia-smi.txt"
python3 bench/device_suite.py --call "$call" --out "$out" "$@" 2>&1 | tee "$out/device-suite-call$call.log"
exit "${PIPESTATUS[0]}"
