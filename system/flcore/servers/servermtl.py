"""FedMTL (Smith, Chiang, Sanjabi, Talwalkar, "Federated Multi-Task Learning", NeurIPS 2017).

Each client is a task with a model of its own, w_t, and the federation minimises
``sum_t L_t(w_t) + lamda/2 tr(W Omega W^T)`` (``-lam``): the tasks are coupled through the relationship
matrix Omega, never averaged into one model. Shared: each trained client uploads w_t, and the server keeps
every task's latest model (a task not trained yet: the initial model, which every client starts from).
Local: w_t itself; before a selected client trains, the server sends it the pull ``Omega_tt (w_t - a_t)``'s
anchor a_t from the other tasks' models (``clientmtl``). Reported: each client's own model.

Omega is the paper's mean-regularised instance, ``I - 11^T/m`` over the m clients, for which
``tr(W Omega W^T) = sum_t ||w_t - w_mean||^2`` and a_t is the mean of the other m - 1 tasks' models.
Where this departs from the paper and from PFLlib:

* The paper's MOCHA solves the W-step in the dual of a convex loss; for a neural network only the primal
  step exists, so W moves by -ls epochs of minibatch SGD on each selected task (the paper's mini-batch
  SGD baseline, on the same objective).
* The paper's alternating Omega-step (``Sigma = (W^T W)^(1/2) / tr(...)``, ``Omega = Sigma^-1``) is not
  run: every client starts from one initial model and a fifth of them train per round, so W^T W is
  singular (rank at most the clients trained so far plus one) and Sigma^-1 does not exist; its starting
  value Omega = m I couples nothing and decays every model by m * lamda per step.
* PFLlib's version flattens ``state_dict()`` (detached), so its regulariser has no gradient and its
  FedMTL trains each client alone; it also reads only the scalar ``Omega[0][0]``. PFLlib's ``-itk``
  (iterations of the dual subproblem) has nothing to set here.

The server's global model is the plain mean of the task models (``w_mean``, Omega's null space); it is
not what any client reports. Under ``X+LAG`` the layers kept personal are left out of a_t, so they are
not coupled.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from flcore.aggregation import State, copy_into, weighted_average
from flcore.clients.clientmtl import clientMTL
from flcore.hyperparameters import FedMTLParams
from flcore.servers.latestmodels import LatestModelsServer


def mean_regularised_relationships(num_tasks: int) -> torch.Tensor:
    """``Omega = I - 11^T / m`` (m x m, float64): ``tr(W Omega W^T) = sum_t ||w_t - mean_s w_s||^2``."""
    return torch.eye(num_tasks, dtype=torch.float64) - 1.0 / num_tasks


def relationship_anchor(omega_row: torch.Tensor, task: int, models: Sequence[State],
                        names: Sequence[str]) -> State:
    """``a_t = -(1 / Omega_tt) sum_{s != t} Omega_ts w_s`` for the tensors ``names``.

    ``omega_row``: row t of Omega (m,); ``models``: the m tasks' models by name (``models[task]`` is not
    read). With a_t, the gradient of ``1/2 tr(W Omega W^T)`` in w_t is ``Omega_tt (w_t - a_t)``.
    """
    self_weight = float(omega_row[task])
    if self_weight <= 0:
        raise ValueError(f"Omega's diagonal entry of task {task} must be positive, got {self_weight}")
    others = [s for s in range(len(models)) if s != task]
    weights = [-float(omega_row[s]) / self_weight for s in others]
    return weighted_average([models[s] for s in others], weights, names)


class FedMTL(LatestModelsServer):
    """New clients (-nnc): the mean of the training tasks' models, which is also what couples them as one
    more task (Omega over m + 1 tasks puts a newcomer's anchor at that mean and its self weight at
    m / (m + 1)), then -ften epochs of FedMTL's own objective; each reports its own model."""
    client_class = clientMTL

    hparams: FedMTLParams

    def setup(self) -> None:
        super().setup()  # every task's latest model
        self.relationships = mean_regularised_relationships(self.num_clients)

    def coupled_names(self) -> List[str]:
        """The parameters Omega couples: all but the ones X+LAG keeps personal."""
        personal = self.personal_names()
        return [n for n, _ in self.global_shared_module().named_parameters() if n not in personal]

    def send_models(self) -> None:
        """Each selected client's anchor a_t and Omega_tt (its model stays its own: nothing is loaded)."""
        models, names = self.known_models(), self.coupled_names()
        for client in self.selected_clients:
            row = self.relationships[client.id]
            client.receive_relationships(float(row[client.id]), relationship_anchor(row, client.id, models, names))

    def aggregate_parameters(self) -> None:
        """Keep each upload as its task's model; the global model becomes the tasks' plain mean."""
        self.store_uploads()
        models = self.known_models()
        copy_into(self.global_shared_module(), weighted_average(models, [1.0 / len(models)] * len(models)))

    def receive_new_client(self, client: clientMTL) -> None:
        super().receive_new_client(client)  # the global model: the tasks' mean
        relationships = mean_regularised_relationships(self.num_clients + 1)
        row, task = relationships[self.num_clients], self.num_clients
        models: List[State] = self.known_models() + [{}]  # the newcomer's own entry is never read
        client.receive_relationships(float(row[task]), relationship_anchor(row, task, models, self.coupled_names()))
