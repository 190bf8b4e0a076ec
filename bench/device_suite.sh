#!/usr/bin/env bash
# The device suite on a GPU machine without network, in one call (about 8 minutes on one H200, then
# 2-3 for the Countdown study; the JSON is rewritten after each part):
#   bash bench/device_suite.sh            (writes device-suite-gpu.json and .png under $OUT, else ./device-suite-out)
# Wheels the machine lacks travel in .whl/ (bench/device_wheels.sh fetches them beforehand); they are
# installed into /tmp/site, never over the machine's own packages. A part that fails still leaves the
# others' rows in the JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "device_suite.sh: the wheels did not install; brax parts will fail" >&2
fi
out="${OUT:-$PWD/device-suite-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$out/nvidia-smi.txt"
python3 -m jaxweight bench --suite device --out "$out" "$@" 2>&1 | tee "$out/device-suite.log"
exit "${PIPESTATUS[0]}"
