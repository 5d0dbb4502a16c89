"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021).

Shared: the base (representation), averaged by sample count. Local: the head. Each round a
selected client first trains its head for ``-pls`` epochs with the base frozen, then the base for
``-ls`` epochs with the head frozen, each stage with its own optimiser. No extra loss and no extra
server step; each client is evaluated with the received base and its own head.

PFLlib's ``receive_models`` override for FedRep never reset ``uploaded_ids`` and divided by the
total sample count without a guard; the base ``receive_models`` used here has neither defect.
"""
from flcore.clients.clientrep import clientRep
from flcore.servers.serverbase import Server


class FedRep(Server):
    """New clients (-nnc): the global base and a fresh head (the initial head every training client started
    from), then FedRep's own update with -ften epochs per stage: the head on the received base (base
    frozen), then the base under that head (head frozen)."""
    client_class = clientRep
