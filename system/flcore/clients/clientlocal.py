"""Local training only: the client's model never leaves it."""
from flcore.clients.clientbase import Client


class clientLocal(Client):
    pass
