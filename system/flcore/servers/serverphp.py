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

from flcore.clients.clientphp import clientPHP
from flcore.servers.serverbase import ConfigError, Server


class FedPHP(Server):
    """New clients (-nnc): the global model, which is also their first inherited model (the MMD teacher),
    then one FedPHP local update of -ften epochs; as at any client's first participation the inherited
    model then becomes the trained model (mu_c = 0), and it is what is tested."""
    client_class = clientPHP

    def __init__(self, args, *rest, **kwargs):
        if not 0.0 <= args.lamda < 1.0:
            raise ConfigError(f"FedPHP needs -lam/--lamda in [0, 1) (local loss (1 - lamda) * CE + lamda * MMD; "
                              f"{args.lamda} leaves no cross-entropy); the authors use 0.05 to 0.1: try -lam 0.1")
        if not 0.0 <= args.mu < 1.0:
            raise ConfigError(f"FedPHP needs -mu/--mu in [0, 1) (largest weight of the inherited model in its "
                              f"moving average; the authors use 0.9), got {args.mu}")
        super().__init__(args, *rest, **kwargs)
