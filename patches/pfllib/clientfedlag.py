"""FedLAG's client for an upstream PFLlib checkout (installed by patches/apply_pfllib.py).

FedLAG changes only what the server broadcasts and keeps (flcore/lag), so local training is
FedAvg's: the class exists for PFLlib's file naming (serverX.py / clientX.py).
"""
from flcore.clients.clientavg import clientAVG


class clientFedLAG(clientAVG):
    pass
