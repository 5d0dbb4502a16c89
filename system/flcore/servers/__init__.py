"""One server per algorithm (``server<x>.py``, found by ``flcore/registry.py``) and their base classes:
``Server`` (``serverbase.py``) and ``ClassVectorServer`` (``classvectorserver.py``: the round protocol
of the methods that exchange per-class vectors instead of parameters, FedProto and FD).

Helpers live elsewhere: ``flcore/training/`` (local training, per-class statistics). What a client
keeps as its own is left out of what it receives (``Server.personal_names`` and ``Server.broadcast``),
so a server that builds its own per-client payload reads it from there.
"""
