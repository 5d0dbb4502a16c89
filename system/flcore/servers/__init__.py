"""One server per algorithm (``server<x>.py``, found by ``flcore/registry.py``) and their base classes:
``Server`` (``serverbase.py``) and ``ClassVectorServer`` (``classvectorserver.py``: the round protocol
of the methods that exchange per-class vectors instead of parameters, FedProto and FD).

Helpers live elsewhere: ``flcore/training/`` (local training, per-class statistics) and
``flcore/lagaware.py`` (what ``X+LAG`` keeps personal, asked by X's own server code).
"""
