"""The application: a run's flags (:mod:`.config`), the command line (:mod:`.options`), building a run
from them (:mod:`.build`) and running it (:mod:`.run`: the round loop, checkpoints, resume, results).

It sits above the code it is built from: ``app`` imports ``flcore`` (the algorithms) and ``utils`` (the
helpers), and neither of those imports ``app``.
"""
