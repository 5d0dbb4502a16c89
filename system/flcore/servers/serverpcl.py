"""FedPCL (Yue Tan, Guodong Long, Jie Ma, Lu Liu, Tianyi Zhou, Jing Jiang, "Federated Learning from
Pre-Trained Models: A Contrastive Learning Approach", NeurIPS 2022).

No parameters are shared: every client keeps its whole model. Clients upload their local prototypes (the
mean unit feature of each class they hold, ``clientpcl``); the server keeps every client's latest ones,
and its global prototype of a class is their unweighted mean over the clients that hold it (the
authors' code; each client counts once). Every client receives the bank of the global prototypes and
every client's local prototypes (the classes a client lacks filled with the global ones), and trains its
feature extractor with the prototype-wise contrastive loss against both (temperature ``-tau``, the
authors' 0.07 by default). Each client reports the class of its most similar local prototype.

The paper trains only a small projection on frozen pre-trained backbones; none are available offline
here, so the whole feature extractor trains from its initialisation (as in PFLlib). Where PFLlib's version
differs, this follows the paper and the authors' code: the global prototypes average every client's
latest prototypes (PFLlib: only the round's uploads), the bank holds the clients that have uploaded
(PFLlib fills the others with the global set, counting it again), each prototype is matched to its own
class index (PFLlib stacks them in the order the classes were first seen), classes without a prototype
leave the softmax, and a client trains whenever there are prototypes (PFLlib: only once it has uploaded
itself); gradients are not clipped. ``FedPCL+LAG`` is refused: there are no shared layers.
"""
from __future__ import annotations

import torch

from flcore.clients.clientpcl import clientPCL
from flcore.clients.clientproto import fill_missing
from flcore.servers.classvectorserver import ClassVectorServer
from flcore.training.classvectors import ClassVectors, average_over_holders


def prototype_bank(global_prototypes: ClassVectors, client_sets: ClassVectors) -> ClassVectors:
    """The global prototypes (C, D) stacked above the clients' sets (M, C, D), each set's missing classes
    filled with the global prototypes: (1 + M, C, D) with presence (1 + M, C)."""
    sets = client_sets.vectors.shape[0]
    everywhere = ClassVectors(global_prototypes.vectors.expand(sets, -1, -1),
                              global_prototypes.present.expand(sets, -1))
    filled = fill_missing(client_sets, everywhere)
    return ClassVectors(torch.cat([global_prototypes.vectors.unsqueeze(0), filled.vectors]),
                        torch.cat([global_prototypes.present.unsqueeze(0), filled.present]))


class FedPCL(ClassVectorServer):
    """New clients (-nnc): no parameters (their fresh model is the initial model every training client
    started from) and the prototype bank, which they train against for -ften epochs with FedPCL's own
    loss; they are then classified by the local prototypes they measure."""
    client_class = clientPCL
    persistent_attrs = ClassVectorServer.persistent_attrs + ("client_vectors", "client_present")

    def vector_dim(self) -> int:
        return int(self.global_model.head.in_features)

    def setup(self) -> None:
        super().setup()
        # Every client's latest local prototypes (N, C, D), and which exist (N, C): none before it uploads.
        self.client_vectors = torch.zeros(len(self.clients), *self.global_vectors.shape, device=self.device)
        self.client_present = torch.zeros(len(self.clients), self.num_classes, dtype=torch.bool, device=self.device)

    def class_vector_payload(self) -> ClassVectors:
        uploaded = self.client_present.any(dim=1)
        return prototype_bank(self.global_class_vectors(),
                              ClassVectors(self.client_vectors[uploaded], self.client_present[uploaded]))

    def aggregate_parameters(self) -> None:
        for update, vectors in zip(self.uploads, self.uploaded_vectors):
            self.client_vectors[update.client_id] = vectors.vectors.to(self.client_vectors)
            self.client_present[update.client_id] = vectors.present.to(self.device)
        uploaded = self.client_present.any(dim=1).nonzero().flatten().tolist()
        if not uploaded:
            return
        average = average_over_holders([ClassVectors(self.client_vectors[i], self.client_present[i]) for i in uploaded])
        self.global_vectors = average.vectors
        self.global_present = average.present
