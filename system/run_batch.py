"""Entry script of the grid runner, with ``run_all.sh``'s flags::

    python system/run_batch.py -g benchmarks/grids/quick.grid -j 2 --report
    python system/run_batch.py --help

``./run_all.sh`` runs this script; the logic is in the :mod:`grid` package.
"""
import sys
from pathlib import Path

# An entry script: the project's packages are system/ (grid, flcore, utils) and the root (dataset),
# unless installed with ``pip install -e .``. Library modules never touch sys.path.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from grid.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
