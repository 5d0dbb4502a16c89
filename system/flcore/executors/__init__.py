"""How the selected clients of a round are trained (``--executor``), one module each:

* :mod:`.sequential` - one after another in this process (PFLlib's way, the default);
* :mod:`.ray_cluster` - on a pool of Ray actors, on this machine or a cluster;
* :mod:`.vmapped` - together, one vmapped step for all (``--executor batched``; the engine is
  :mod:`flcore.vmapped`).

Every executor returns one :class:`~flcore.exchange.ClientUpdate` per client, in the clients' order:
that value is all the server aggregates. The server also owns every client's state between rounds,
so an executor that trains a copy elsewhere brings the trained state back with the client's own
:meth:`~flcore.clients.clientbase.Client.get_state` / ``set_state`` (the state checkpoints save),
nothing else. A client's training depends only on that state and its data, so results do not depend
on the executor or on the number of workers - provided every worker uses as many intra-op threads as
the driver (float reductions differ between 1 and 2 threads), which the Ray executor enforces.
The run (:mod:`app.run`) chooses one and owns its life.
"""
