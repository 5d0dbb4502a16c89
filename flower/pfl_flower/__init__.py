"""FedLAG on Flower: a ServerApp (``server_app``, with ``strategy``) and a ClientApp (``client_app``)
around the project's own ``flcore`` code; ``task`` finds the project and converts tensors."""
