"""FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021).

Shared: every parameter and buffer except those of normalisation layers, averaged by sample count
as in FedAvg. Local: the normalisation layers' affine parameters and running statistics
(``running_mean``, ``running_var``, ``num_batches_tracked``), so each client normalises with its own
feature statistics; the server never averages them and the broadcast never overwrites them. No
extra loss. Each client is evaluated with the received model and its own normalisation layers.
On a model without normalisation layers FedBN is FedAvg.
"""
from flcore.clients.clientbn import clientBN
from flcore.servers.serverbase import Server


class FedBN(Server):
    """New clients (-nnc): every global tensor except the normalisation layers, which start fresh (their
    initial affine parameters and running statistics; the server never averages them), then -ften epochs
    of cross-entropy fine-tuning, during which those layers learn the newcomer's own feature statistics."""
    client_class = clientBN
