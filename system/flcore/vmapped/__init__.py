"""The vmapped engine behind ``--executor batched``: the selected clients of a round train together, one
vmapped step for all.

* :mod:`.support`  - the declarations client classes and models make for it (what it trains, why not);
* :mod:`.view`     - each client's objective (``flcore.training.objective``) on stacked, functional tensors;
* :mod:`.schedule` - every client's minibatches, drawn from its own generator as ``train_batches`` does;
* :mod:`.stacking` - client models stacked along a client axis, and the train data of all clients;
* :mod:`.engine`   - the step loop over one group of clients;
* :mod:`flcore.executors.vmapped` - :class:`~flcore.executors.vmapped.BatchedExecutor`, the executor that
  runs it (what ``make_executor`` returns for ``--executor batched``).

Nothing is imported here, so :mod:`app.options` can ask :mod:`.support` about a flag combination
without loading the engine.
"""
