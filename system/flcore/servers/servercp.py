"""FedCP (Jianqing Zhang, Yang Hua, Hao Wang, Tao Song, Zhengui Xue, Ruhui Ma, Haibing Guan, "FedCP:
Separating Feature Information for Personalized Federated Learning via Conditional Policy",
KDD 2023).

Shared and averaged by sample count: the base, the global head (uploaded as the mean of the
client's personal head and the global head it received) and the Conditional Policy Network (CPN).
Local: the personal head. Per feature, the CPN splits the base's features into a personal part for
the personal head and a global part for the frozen global head; the extra loss is ``-lam`` times the
MMD between the features and those of the received base. Each client reports received base, global
head and CPN with its own personal head. ``rs_personal_share`` records, per round, the mean share
of the features the trained clients' policies routed to their personal heads.

The global head and CPN are submodules of ``client.model`` (:class:`FedCPModel`), so the ordinary
upload, average and broadcast carry them and, under ``FedCP+LAG``, they are candidates for
personalisation like the base's layers. Differences from PFLlib:
* every client receives the new global head and CPN (PFLlib gives them only to the clients that
  trained in the round; the others keep stale copies until they are selected);
* the context comes from the client's personal head from round 0 on (PFLlib starts from a random
  vector drawn from the global generator);
* the Gumbel noise is drawn from the client's own generator, and evaluation uses the noise-free
  policy (PFLlib samples noise at evaluation too, so its accuracy is random and draws from the
  global generator);
* FedCP stores its train loss and honours ``-ab`` like every other method.
"""
from __future__ import annotations

from torch import nn

from flcore.aggregation import sample_weights
from flcore.clients.clientcp import clientCP
from flcore.hyperparameters import FedCPParams
from flcore.servers.serverbase import Server
from flcore.trainmodel.fedcp_model import FedCPModel
from utils.datasets import DatasetInfo


class FedCP(Server):
    """New clients (-nnc): the global base, global head and CPN and a fresh personal head (the initial
    head every training client started from), then -ften epochs of cross-entropy fine-tuning on the
    noise-free prediction (the global head stays frozen, as in local training)."""
    client_class = clientCP

    def __init__(self, config, hparams: FedCPParams, times: int, model: nn.Module, data: DatasetInfo,
                 store=None):
        super().__init__(config, hparams, times, FedCPModel(model.base, model.head), data, store)

    def end_round(self, rnd: int) -> None:
        trained = list(self.trained_updates.values())
        if trained:
            weights = sample_weights([u.num_samples for u in trained])
            self.record("rs_personal_share", sum(w * u.extras["personal_share"] for w, u in zip(weights, trained)))
