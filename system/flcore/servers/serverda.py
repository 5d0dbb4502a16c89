"""PFL-DA ("Personalized Federated Learning via Domain Adaptation with an Application to Distributed 3D
Printing", Technometrics 2023): personalisation through domain adaptation.

Shared: the global head g, averaged by sample count (the server's model is the head; its base is never
averaged, as in LG-FedAvg). Local: each client's encoder, trained through the global head so that its
features fit what the shared head reads (covariate shift), and a personal head on those features, pulled
towards the received global head by ``lamda/2 ||h_i - g||^2`` (``-lam``; concept shift). Reported: each
client's encoder with its personal head (``clientda``).

Where this departs from PFLlib, towards the authors' code (the sine study of the paper's repository):
PFLlib computes its pull ``lamda ||g - h_i||`` on detached copies (``.data``), so it has no gradient and
its personal head never sees the global one; here the pull is differentiated, in the quadratic form of
the authors' step ``h_i <- 0.9 g + 0.1 h_i`` at each round's start (a proximal pull of the same kind, on
every step). The personal head and the encoder take one step each per minibatch, as the authors
interleave them, where PFLlib runs all of the head's epochs first and the encoder's after.
"""
from flcore.clients.clientda import clientDA
from flcore.servers.serverbase import Server


class PFL_DA(Server):
    """New clients (-nnc): the global head and a fresh encoder (the initial one every training client
    started from; encoders are never averaged), their personal head starting as that global head, then
    -ften epochs of PFL-DA's own local update; they report encoder and personal head, as every client does."""
    client_class = clientDA
