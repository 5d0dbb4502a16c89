"""``python -m grid [run_all.sh flags]`` where the project is installed (``pip install -e .``); from a
checkout, ``./run_all.sh`` or ``python system/run_batch.py`` do the same."""
import sys

from grid.cli import main

sys.exit(main())
