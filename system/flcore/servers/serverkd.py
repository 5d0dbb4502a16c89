"""FedKD (Wu, Wu, Lyu, Huang, Xie, "Communication-efficient federated learning via knowledge
distillation", Nature Communications 13, 2032, 2022).

Shared: the mentee, a model every client trains with its private mentor by adaptive mutual distillation
(see ``clientkd``). Both directions travel compressed, by the paper's dynamic gradient approximation: a
client sends its mentee's update as truncated SVDs keeping the round's share T of each matrix's energy;
the server averages the rebuilt updates (unweighted, as the paper and the authors' code do), compresses
that mean the same way and adds it to the global mentee, which every client then receives. T rises
linearly from ``-Ts`` (round 0) to ``-Te`` (the last round). Recorded per round: ``fedkd_energy`` (T),
and the numbers sent for the mentee's parameters as a share of their count, uploads
(``fedkd_upload_fraction``, all uploaders together) and the global update (``fedkd_download_fraction``).

Reported: the mentors (``rs_test_acc``); the global mentee on the same clients is ``rs_global_test_acc``.
As in PFLlib the mentor has the mentee's architecture (``-m``; the paper's mentor is a larger model) and
starts from the same initial weights; ``W_h`` starts as the identity.
"""
from __future__ import annotations

from typing import Optional

from flcore.aggregation import copy_into
from flcore.clients.clientkd import clientKD
from flcore.exchange import ClientUpdate
from flcore.hyperparameters import FedKDParams
from flcore.servers.privatemodelserver import PrivateModelServer
from flcore.training.lowrank import dense_size, low_rank_step, scheduled_energy


class FedKD(PrivateModelServer):
    """New clients (-nnc): the global mentee, a fresh mentor (the initial model every training client's mentor
    started from) and an identity ``W_h``, then -ften epochs of FedKD's mutual distillation; the mentor is
    tested."""
    whole_uploads_needed = "it rebuilds each upload's whole update from its compressed form"
    client_class = clientKD

    hparams: FedKDParams

    def setup(self) -> None:
        super().setup()
        self.parameter_count = dense_size(dict(self.global_shared_module().named_parameters()))

    def round_energy(self) -> float:
        """T of the current round."""
        return scheduled_energy(self.hparams.energy_start, self.hparams.energy_end, self.current_round,
                                self.global_rounds)

    def send_models(self) -> None:
        super().send_models()
        energy = self.round_energy()
        for client in self.clients:
            client.compression_energy = energy

    def extras_problem(self, update: ClientUpdate) -> Optional[str]:
        sent = update.extras.get("numbers_sent")
        if isinstance(sent, bool) or not isinstance(sent, int) or not 0 <= sent <= self.parameter_count:
            return f"its count of numbers sent {sent!r} is not a whole number in [0, {self.parameter_count}]"
        return None

    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        mean = self.average_uploads([1.0 / len(self.uploads)] * len(self.uploads))
        module = self.global_shared_module()
        parameters = dict(module.named_parameters())
        energy = self.round_energy()
        rebuilt, sent = low_rank_step({n: p.detach() for n, p in parameters.items()},
                                      {n: mean[n] for n in parameters}, energy)
        mean.update(rebuilt)
        copy_into(module, mean)
        self.record("fedkd_energy", energy)
        self.record("fedkd_upload_fraction",
                    sum(u.extras["numbers_sent"] for u in self.uploads) / (len(self.uploads) * self.parameter_count))
        self.record("fedkd_download_fraction", sent / self.parameter_count)
