"""GPFL (Jianqing Zhang, Yang Hua, Hao Wang, Tao Song, Zhengui Xue, Ruhui Ma, Jian Cao, Haibing Guan,
"GPFL: Simultaneously Learning Global and Personalized Feature Information for Personalized
Federated Learning", ICCV 2023).

Shared and averaged by sample count: the base, the Global Category Embedding layer (GCE) and the
Conditional Valve (CoV). Local: the head, which classifies the CoV's personalised route. Extra loss:
the GCE's angle-level cross-entropy on the generic route plus ``-lam`` times its distance to the
received embedding of the true class; ``-mu`` is weight decay on the GCE and CoV. Each client
reports its personalised route: received base, GCE and CoV with its own head.

The GCE and CoV are submodules of ``client.model`` (:class:`GPFLModel`), so the ordinary upload,
average and broadcast carry them and, under ``GPFL+LAG``, they are candidates for personalisation
like the base's layers. Differences from PFLlib, which keeps them outside the model:
* the conditional inputs are made from the embeddings the client received (PFLlib makes them from
  the client's previous embeddings, one round stale, and uses zeros before the first aggregation);
* the magnitude term is the mean over samples of each sample's L2 distance, as in the paper
  (PFLlib takes the Frobenius norm of the whole batch, which grows with the square root of the
  batch size: PFLlib's ``-lam`` at batch size B corresponds to about ``lam * sqrt(B)`` here);
* ``-ld`` decays the GCE/CoV learning rate together with the model's (PFLlib never decays them);
* the reported train loss is the cross-entropy of the reported prediction, as for every method.
"""
from __future__ import annotations

from torch import nn

from flcore.clients.clientgpfl import clientGPFL
from flcore.hyperparameters import GPFLParams
from flcore.servers.serverbase import Server
from flcore.trainmodel.gpfl_model import GPFLModel
from utils.datasets import DatasetInfo


class GPFL(Server):
    """New clients (-nnc): the global base, GCE and CoV and a fresh head (the initial head every
    training client started from), with the conditional inputs weighted by the newcomer's own label
    distribution, then -ften epochs of cross-entropy fine-tuning on its personalised route."""
    client_class = clientGPFL

    def __init__(self, config, hparams: GPFLParams, times: int, model: nn.Module, data: DatasetInfo,
                 store=None):
        super().__init__(config, hparams, times, GPFLModel(model.base, model.head, config.num_classes), data, store)
