"""FedLAG for an upstream PFLlib checkout (installed by patches/apply_pfllib.py).

FedLAG (arXiv 2410.02845) keeps, every round, the ``--lag_top_k`` layers whose client updates
conflict most (pairwise cosine below ``--lag_xi``) personal on every client and averages the rest
as FedAvg does. The mechanism is ``flcore/lag`` (``LayerConflictMixin``); this class only puts it
on top of upstream's own FedAvg server. ``-algo FedLAG`` runs main.py's FedAvg branch (same model
wrapping) with this class in place of FedAvg; ``-algo X+LAG`` composes any other server the same
way (``flcore.lag_pfllib.compose``).
"""
from flcore.clients.clientavg import clientAVG
from flcore.clients.clientfedlag import clientFedLAG
from flcore.lag import LayerConflictMixin
from flcore.lag_pfllib import UpstreamCompat, UpstreamDelivery
from flcore.servers.serveravg import FedAvg


class FedLAG(UpstreamDelivery, LayerConflictMixin, UpstreamCompat, FedAvg):
    def set_clients(self, clientObj):
        # Upstream FedAvg.__init__ calls set_clients(clientAVG); FedLAG's clients are the same.
        super().set_clients(clientFedLAG if clientObj is clientAVG else clientObj)
