"""FedLAG's ServerApp: runs once per run, in the process the SuperLink starts for it.

It builds the global model exactly as ``system/main.py -algo FedLAG`` does (same flags, same seed,
same layer names), runs :class:`~pfl_flower.strategy.FedLagStrategy` for ``num-server-rounds`` rounds
over the connected SuperNodes, and writes

* ``<results-dir>/<dataset>_FedLAG_<goal>_0.h5``: the project's result file (``rs_test_acc`` ...,
  ``lag_layer_names``, ``lag_conflict_scores`` (rounds x layers), ``lag_personal`` (the choice made
  at the end of each round), ``lag_num_uploads``, ``rs_failed_nodes`` / ``rs_failed_evaluate_nodes``
  (per round, the sampled nodes that failed, never replied, or whose reply failed the server's checks)),
  with the run configuration as JSON attributes; it is marked ``complete`` only when no node failed (else
  ``failures`` lists them), and is written, marked incomplete, when the run stops with an error;
* ``<results-dir>/<dataset>_FedLAG_<goal>_0.global.npz``: the final global (averaged) model.
"""
from __future__ import annotations

from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from . import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    repo = task.use_project(context)  # the project's modules are importable from here on
    from dataset.utils.atomic_io import atomic_path
    from utils.accuracy_summary import summary_from_arrays
    from utils.datasets import dataset_info
    from utils.result_utils import result_path, write_results

    from .strategy import FedLagStrategy

    config = task.project_config(context, repo)
    # The dataset's config.json gives the model its shapes, and bounds every reply by its partition's
    # samples: a server that cannot read it stops before the first round, in one line saying how to build it.
    data = dataset_info(config.dataset, config.num_clients, config.data_dir)
    model = task.build_model(config)
    run = context.run_config
    min_nodes = task.run_int(context, "min-nodes", 2, 1)
    num_rounds = task.run_int(context, "num-server-rounds", 3, 1)
    strategy = FedLagStrategy(config.lag, [n for n, _ in model.named_parameters()], num_rounds=num_rounds,
                              train_samples=data.train_samples[:config.num_clients],
                              test_samples=data.test_samples[:config.num_clients], eval_gap=config.eval_gap,
                              fraction_train=task.run_fraction(context, "fraction-train", 1.0),
                              fraction_evaluate=task.run_fraction(context, "fraction-evaluate", 1.0),
                              min_train_nodes=min_nodes, min_evaluate_nodes=min_nodes,
                              min_available_nodes=min_nodes)
    path = result_path(Path(config.results_dir), config.dataset, task.ALGORITHM, config.goal, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    attrs = {"config": config.flags(), "flower_run_config": dict(run), "engine": "flower", "run": 0,
             "algorithm": task.ALGORITHM, "dataset": config.dataset}

    def write_run(**overrides) -> None:
        """The .h5 of the rounds so far, with the accuracy summary main.py's runs carry (``summary``)."""
        series = strategy.result_arrays()
        write_results(path, series, {**attrs, **strategy.run_status(), **overrides,
                                     "summary": summary_from_arrays(series, config.report_last_k).as_attrs()})
    try:
        result = strategy.start(grid=grid, initial_arrays=task.to_record(model.state_dict()),
                                num_rounds=num_rounds,
                                train_config=ConfigRecord(), evaluate_config=ConfigRecord())
    except Exception:
        # Keep the rounds done (marked incomplete, with the failures seen) before Flower records the error;
        # a failure to do so is logged and never hides the run's own error.
        try:
            write_run(complete=False)
            log(INFO, "FedLAG results so far written to %s (incomplete)", path)
        except Exception as not_written:  # noqa: BLE001
            log(WARNING, "could not write the results so far to %s: %s", path, not_written)
        raise
    # complete only when every node sampled in every round replied; else the failures are listed.
    write_run()
    arrays = result.arrays if result.arrays else task.to_record(model.state_dict())  # no round aggregated
    final = {name: tensor.numpy() for name, tensor in task.from_record(arrays).items()}
    model_path = path.with_suffix(".global.npz")
    with atomic_path(model_path) as tmp, open(tmp, "wb") as fh:  # a file object: np.savez adds no suffix
        np.savez(fh, **final)
    if strategy.failures:
        log(WARNING, "%d node replies failed or never came (listed in the .h5's 'failures'); the results are "
            "not marked complete", len(strategy.failures))
    log(INFO, "FedLAG results written to %s and %s", path, model_path)
