"""FedBABU (Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022).

Shared: the body (base), averaged by sample count. The head is never trained during federated
rounds: it keeps its random initial value, identical on all clients, so every client learns a body
for the same fixed classifier. After the last round (``finish``) every client receives the final
body and fine-tunes body and head for ``-fte`` epochs; that evaluation is recorded as
``rs_finetune_*``, apart from the per-round ``rs_test_acc`` (base + frozen head).

Differences from PFLlib: clients fine-tune the final aggregated body (PFLlib fine-tunes whatever
each client last held, so the last aggregate is never used), and the fine-tuned accuracy gets its
own series instead of one extra entry appended to ``rs_test_acc``. PFLlib once froze the wrong
module while fine-tuning (TsingZ0/PFLlib#245); here fine-tuning trains both.
"""
from flcore.clients.clientbabu import clientBABU
from flcore.hyperparameters import FedBABUParams
from flcore.servers.serverbase import Server


class FedBABU(Server):
    """New clients (-nnc): the global body and the head every client shares by design (the fixed initial
    head, never trained in the rounds), then -ften epochs of FedBABU's fine-tuning of body and head
    together, as every client does in :meth:`finish`."""
    client_class = clientBABU

    hparams: FedBABUParams

    def setup(self) -> None:
        self.fine_tuning_epochs = self.hparams.fine_tuning_epochs

    def finish(self) -> None:
        self.send_models()
        self.fine_tune_clients(self.evaluation_clients(), self.fine_tuning_epochs)  # only the measured need it
        self.evaluate(prefix="rs_finetune")
