"""pFedMe (T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020).

Clients share their local models w (uploaded and averaged); each keeps a private personalised model
theta, the approximate minimiser of ``CE(theta) + lamda/2 * ||theta - w||^2`` (see ``clientpFedMe``),
which is what is reported. The server's extra step mixes the new (sample-weighted) average with the
previous global model: ``w <- (1 - beta) * w_previous + beta * average`` (``-bt``; the paper uses
beta = 1 or 2), on parameters; buffers keep the plain average.

PFLlib's shared ``-bt`` default is 0, which would keep the global model at its initial value forever;
pFedMe refuses ``-bt <= 0`` instead of running such a no-op.
"""
from __future__ import annotations

from flcore.aggregation import copy_into
from flcore.clients.clientpFedMe import clientpFedMe
from flcore.hyperparameters import PFedMeParams
from flcore.servers.serverbase import Server
from flcore.training.personal import interpolate, parameter_copies, parameter_views


class pFedMe(Server):
    """New clients (-nnc): the global model as their local model w and as the start of their
    personalised model theta, then -ften epochs of pFedMe's own local update (theta's inner steps, w
    pulled towards theta); theta is tested."""
    client_class = clientpFedMe

    hparams: PFedMeParams

    def setup(self) -> None:
        self.beta = self.hparams.server_mixing

    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        shared = self.global_shared_module()
        previous = parameter_copies(shared)
        super().aggregate_parameters()
        # Parameters only: buffers are statistics, not iterates, and with beta > 1 an extrapolated
        # BatchNorm variance could turn negative; they keep the plain average.
        copy_into(shared, interpolate(previous, parameter_views(shared), 1.0 - self.beta))

