#!/usr/bin/env bash
# Build arctic-inference's suffix-tree extension alone (nanobind C++, no torch) for another Python, into
# .device-pkgs/ (git-ignored), so `method="suffix"` can run on a machine that cannot fetch or build
# arctic-inference itself (the device machine: no internet; its python3 is 3.12). Carry the folder
# there and put it on PYTHONPATH (gpu_suite.sh does, with SUFFIX=1). Only the package's
# suffix_decoding module is kept: it is all the suffix plugin imports. From the repo root, with the
# sdist and that Python here:
#   PY=python3.12 SDIST=/path/arctic_inference-0.3.0.tar.gz bash benchmarks/build_suffix_backend.sh
set -eu
PY=${PY:-python3.12}
SDIST=${SDIST:?the arctic_inference-0.3.0 sdist (pip download --no-deps --no-binary :all: arctic-inference==0.3.0)}
DEST=${DEST:-.device-pkgs}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar -C "$WORK" -xzf "$SDIST"
SRC=$(echo "$WORK"/arctic_inference-*)
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q nanobind==2.9.2
# libstdc++ linked statically: the other machine's may be older than this one's.
cmake -S "$SRC/csrc/suffix_decoding" -B "$WORK/build" -DPython_EXECUTABLE="$WORK/venv/bin/python" \
    -DCMAKE_SHARED_LINKER_FLAGS="-static-libstdc++ -static-libgcc" > "$WORK/cmake.log"
cmake --build "$WORK/build" -j 2 > "$WORK/build.log"
mkdir -p "$DEST/arctic_inference/suffix_decoding"
cp "$SRC/arctic_inference/__init__.py" "$DEST/arctic_inference/"
cp "$SRC/arctic_inference/suffix_decoding/__init__.py" "$SRC/arctic_inference/suffix_decoding/cache.py" \
    "$WORK"/build/_C.*.so "$DEST/arctic_inference/suffix_decoding/"
echo "built $(ls "$DEST"/arctic_inference/suffix_decoding/_C.*.so)"
