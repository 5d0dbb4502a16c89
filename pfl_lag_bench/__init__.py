"""The one name ``pip install -e .`` installs: ``import pfl_lag_bench`` (or its commands) makes the checkout's
packages importable, as the entry scripts ``system/main.py``, ``system/report.py`` and
``system/run_batch.py`` do for themselves.

The checkout keeps PFLlib's layout, whose packages have generic names (``utils``, ``flcore``, ``grid``,
``dataset``). Installed as top-level packages they would shadow, or be shadowed by, other projects'
modules of the same names in the environment; so only this package is installed, and the checkout's
folders (``system/`` and the root) join ``sys.path`` when it is imported: by a command of this
project, or by code that asks for them explicitly with ``import pfl_lag_bench``.

    python -m pfl_lag_bench run -algo FedLAG -data Digits     # system/main.py
    python -m pfl_lag_bench report results/                   # system/report.py
    python -m pfl_lag_bench grid -a FedAvg -d Digits -p iid   # run_all.sh's grid runner
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if not (REPO / "system" / "main.py").is_file():
    raise ImportError(f"pfl_lag_bench works from a checkout of the repository (pip install -e .); "
                      f"{REPO} holds none")
for _folder in (REPO / "system", REPO):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
