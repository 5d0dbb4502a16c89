#!/usr/bin/env bash
# run_all.sh: run a grid of algorithms x datasets x partitions x models x seeds through system/main.py.
#
#   ./run_all.sh                                   # the quick grid (benchmarks/grids/quick.grid), Digits
#   ./run_all.sh -g benchmarks/grids/quick.grid -j 2 --report
#   ./run_all.sh -a "FedAvg FedLAG FedRep FedRep+LAG" -d MNIST -p "dir0.1 dir1.0" -s 0-2 -r 50 \
#                --source MNIST=mnist.npz -- -lbs 16     # a local .npz: uint8 images x, labels y
#
# ./run_all.sh --help prints the flags. The logic is the Python package system/grid/ (the same as
# `python system/run_batch.py`); this wrapper only picks the interpreter: $PYTHON, else python on PATH.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-$(command -v python || command -v python3)}"
exec "$PY" "$REPO/system/run_batch.py" "$@"
