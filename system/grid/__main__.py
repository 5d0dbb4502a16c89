"""``python -m grid [run_all.sh flags]`` with ``system/`` on the path (``pfl-lag-bench grid`` once the
project is installed with ``pip install -e .``); ``./run_all.sh`` and ``python system/run_batch.py`` do the
same."""
import sys

from grid.cli import main

sys.exit(main())
