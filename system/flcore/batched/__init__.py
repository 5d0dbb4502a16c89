"""``--executor batched``: the selected clients of a round train together, one vmapped step for all.

* :mod:`.support`  - which client classes and models the engine trains, and why the others are refused;
* :mod:`.losses`   - each supported local objective as a function of (parameters, buffers, batch);
* :mod:`.schedule` - every client's minibatches, drawn from its own generator as ``train_batches`` does;
* :mod:`.stacking` - client models stacked along a client axis, and the train data of all clients;
* :mod:`.engine`   - the step loop over one group of clients;
* :mod:`.executor` - :class:`~flcore.batched.executor.BatchedExecutor`, what ``make_executor`` returns.

Nothing is imported here, so :mod:`app.options` can ask :mod:`.support` about a flag combination
without loading the engine.
"""
