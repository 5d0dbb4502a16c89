"""Local training only: the client's model never leaves it."""
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client


class clientLocal(Client):
    batched = PLAIN
