"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2003.13461, 2020).

Only the global model w is shared and averaged (FedAvg's server step). Each client privately keeps a
local model v and a learned mixing weight alpha (``-al`` is its initial value, in [0, 1]) and reports
the personalised mixture ``alpha * v + (1 - alpha) * w`` (see ``clientapfl``). Every client's alpha
is recorded after each round (``apfl_alpha``, rounds x clients).
"""
from __future__ import annotations

import numpy as np

from flcore.clients.clientapfl import clientAPFL
from flcore.servers.serverbase import Server


class APFL(Server):
    """New clients (-nnc): the global model as w and as the start of their local model v, with the
    initial mixing weight -al (so the mixture starts as the global model), then -ften epochs of APFL's own
    updates of w, v and alpha; the mixture is tested."""
    client_class = clientAPFL

    def end_round(self, rnd: int) -> None:
        self.record("apfl_alpha", np.array([client.alpha for client in self.in_use(self.clients)]))
