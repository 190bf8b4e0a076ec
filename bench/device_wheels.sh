#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels the device suite needs on a GPU machine without network
# (Python 3.12, x86-64, manylinux): what that machine's image lacks for the brax parts. They go to
# .whl/ in the checkout's root (git-ignored); about 48 MB (gymnax imports seaborn, hence pandas).
# The GPU machine's image already has jax (CUDA), flax, optax, chex, scipy, orbax-checkpoint,
# matplotlib, absl-py, etils, jinja2, werkzeug, pillow, msgpack, protobuf.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pkgs=(gymnax==1.0.1 gymnasium==1.3.0 farama-notifications==0.0.6 brax==0.14.2 flask==3.1.3 flask-cors==6.0.5
      blinker==1.9.0 itsdangerous==2.2.0 jaxopt==0.8.5 ml-collections==1.1.0 mujoco==4.0.0 mujoco-core==4.0.0
      mujoco-studio==4.0.0 websockets glfw pyopengl mujoco-mjx==3.17.0 tensorboardx==2.6.5 trimesh==5.2.0
      six==1.17.0 cloudpickle==3.1.2 seaborn==0.13.2 pandas==3.1.1 python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6)
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl "$p"
done
du -sh .whl
