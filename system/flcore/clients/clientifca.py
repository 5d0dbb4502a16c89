"""IFCA's client (Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020).

Each round it receives every cluster model, takes the one of lowest loss on its own training data
(its cluster estimate), trains it with plain local SGD and uploads it with the cluster's index.
"""
from flcore.training.cluster_choice import ClusterChoosingClient
from flcore.vmapped.support import PLAIN


class clientIFCA(ClusterChoosingClient):
    # The choice happens before training (when the server sends the models); training itself is plain.
    batched = PLAIN

    def upload_extras(self) -> dict:
        return {"cluster": self.cluster}
