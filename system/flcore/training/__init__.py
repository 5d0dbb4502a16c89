"""Local-training helpers shared by several algorithms; none of them is an algorithm itself.

* ``objective.py``: the minibatch objective as one function both executors run (``Objective``, the
  ``ModelView`` it reads the model through, ``LiveModel`` over the client's own modules);
* ``parttraining.py``: training one part of a head-split model at a time (FedRep, FedBABU, FedPAC);
* ``personal.py``: tools for clients that keep a private model beside the shared one (Ditto, APFL,
  pFedMe, PerAvg, FedPHP; pFedMe's server uses ``interpolate`` too);
* ``received.py``: the model a client received, kept frozen while it trains
  (``ReceivedModelClient``: FedProx, FedDyn, MOON, FedNTD, SCAFFOLD);
* ``label_counts.py``: per-class counts and proportions of a client's training labels (FedROD, GPFL);
* ``classfeatures.py``: per-class feature statistics, i.e. class prototypes, and their pooling on the
  server (FedGH, FedPAC, FedAS);
* ``classvectors.py``: the per-class vectors FedProto and FD exchange instead of parameters, and
  their average over the clients that hold each class;
* ``cluster_choice.py``: a client that takes, among cluster models, the one of lowest loss on its own
  training data (IFCA, CFL).

Algorithms live in ``flcore/clients/client<x>.py`` and ``flcore/servers/server<x>.py``; parts of
models (FedCP's and GPFL's extra modules) in ``flcore/trainmodel/``.
"""
