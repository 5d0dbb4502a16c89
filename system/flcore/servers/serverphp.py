"""FedPHP (Li, Zhan, Shao, Li, Song, "FedPHP: Federated Personalization with Inherited Private Models",
ECML-PKDD 2021).

The whole model is shared and averaged as in FedAvg. Each client keeps a private inherited model
(HPM), a moving average of its locally trained models, which supervises the next local training through
an MMD term on features and is what the client reports (see ``clientphp``).

PFLlib's shared defaults do not fit: ``-lam 1`` would drop the cross-entropy term entirely, so FedPHP
refuses ``-lam`` outside [0, 1) (the authors use 0.05 to 0.1). ``-mu 0`` (the default) means no
inheritance, the HPM being the last local model; the authors use ``-mu 0.9``.
"""
from __future__ import annotations

from typing import List, Sequence

from flcore.clients.clientphp import clientPHP
from flcore.servers.serverbase import Server


class FedPHP(Server):
    """New clients (-nnc): the global model, which is also their first inherited model (the MMD teacher),
    then one FedPHP local update of -ften epochs; as at any client's first participation the inherited
    model then becomes the trained model (mu_c = 0), and it is what is tested."""
    client_class = clientPHP

    def set_clients(self, ids: Sequence[int]) -> List[clientPHP]:
        clients = super().set_clients(ids)
        for client in clients:
            client.expected_participations = self.expected_participations()
        return clients

    def expected_participations(self) -> int:
        """How many rounds a client takes part in, as the authors count it: -jr of the -gr rounds (at least
        one). The inherited model's weight reaches -mu after that many participations."""
        return max(int(self.join_ratio * self.global_rounds), 1)
