"""FedLAG inside an upstream PFLlib checkout: the ``--lag_*`` flags, the ``-algo`` hook, the upstream glue.

Installed as ``system/flcore/lag_pfllib.py`` by ``patches/apply_pfllib.py``; main.py's block calls
``install_lag(parser, globals())``, which adds the flags and puts a :class:`LagRun` in place of ``run``.
For ``-algo FedLAG`` (FedAvg+LAG) and ``-algo X+LAG`` it executes main.py's own ``run`` code with
``args.algorithm`` a :class:`LagName` (the typed name, also equal to X, so X's branch runs: X's model
wrapping and server, results under the typed name) and with a copy of main.py's globals in which the
class X's branch builds (``server = FedRep(args, i)``) is :class:`UpstreamDelivery` + LayerConflictMixin +
:class:`UpstreamCompat` + that class. main.py's globals and the parsed ``args`` stay as they are; other names
run ``run`` unchanged.
Only the standard library is imported here (torch comes with ``flcore.lag`` in a LAG run).
"""
from __future__ import annotations

import copy
import json
import os
import re
import types
from typing import Dict, Optional

FEDLAG, FEDLAG_BASE, SUFFIX = "FedLAG", "FedAvg", "+LAG"  # -algo FedLAG is -algo FedAvg+LAG
BRANCH = re.compile(r"""\s*(?:el)?if args\.algorithm == (["'])(.+?)\1\s*:""")
SERVER = re.compile(r"\s*server = (\w+)\(")

# Upstream algorithms whose uploads are not parameter modules: there is nothing for LAG to rank,
# or the mixin would misread what is uploaded (PFLLIB.md sections 1.4 and 2).
NO_LAG: Dict[str, str] = {
    "Local": "Local shares no parameters",
    "FedProto": "FedProto shares class prototypes, not parameters",
    "FD": "FD shares per-class logits, not parameters",
    "FedPCL": "FedPCL shares prototypes, not parameters",
    "FedGH": "FedGH clients upload prototypes, not parameters",
    "SCAFFOLD": "upstream SCAFFOLD leaves uploaded_models empty (it uploads deltas)",
    "FedFomo": "upstream FedFomo leaves uploaded_models empty and averages on the clients",
    "FedKD": "upstream FedKD uploads compressed numpy dicts, not modules",
    "APPLE": "APPLE has no server-side average",
    "FedAMP": "FedAMP has no server-side average",
    "FedMTL": "FedMTL has no server-side average",
}


def dispatch(source: str) -> Dict[str, str]:
    """``-algo`` name -> the class its branch builds, read from main.py's lines: each
    ``if args.algorithm == "X":`` (or ``elif``) with the first ``server = SomeClass(`` line after it."""
    found: Dict[str, str] = {}
    name = None
    for line in source.splitlines():
        if BRANCH.match(line):
            name = BRANCH.match(line)[2]
        elif name is not None and SERVER.match(line):
            found.setdefault(name, SERVER.match(line)[1])
            name = None
    return found


def base_algorithm(name: str) -> Optional[str]:
    """The upstream algorithm behind a LAG name (``FedLAG`` -> ``FedAvg``), None for other names."""
    if name == FEDLAG:
        return FEDLAG_BASE
    return name[:-len(SUFFIX)] if name.endswith(SUFFIX) else None


class LagName(str):
    """``X+LAG`` that also compares equal to ``X``. It prints, formats and hashes as the typed name."""

    def __new__(cls, name: str, base: str):
        self = super().__new__(cls, name)
        self.base = base
        return self

    def __eq__(self, other):
        return str(self) == other or self.base == other

    def __ne__(self, other):
        return not self == other

    __hash__ = str.__hash__


# ----- the server side -------------------------------------------------------------------------------
class UpstreamDelivery:
    """First in the bases (``UpstreamDelivery, Mixin, UpstreamCompat, X``): with ``--lag_share groups`` the
    members receive their group's model as soon as it is formed, at the end of aggregation. Upstream's
    round loop, and what its servers do after it (FedBABU's fine-tuning), read the clients' models directly
    and know no payloads; upstream's broadcast (:meth:`UpstreamCompat.send_models`) then keeps the group's
    model as each member's own copy."""

    def aggregate_parameters(self):
        super().aggregate_parameters()
        self.send_personal_payloads()


class UpstreamCompat:
    """Sits between ``LayerConflictMixin`` and an upstream server class (``Mixin, UpstreamCompat, X``).

    * After X's ``receive_models``, turns upstream's ``uploaded_ids`` / ``uploaded_models`` (PFLlib's
      contract: modules of the clients' models) into the ``uploads`` the mixin scores (:class:`Upload`,
      shaped like the project's ``ClientUpdate``), and rebuilds ``uploaded_ids`` from them, one id per
      entry of ``uploaded_models``: upstream FedRep/FedPer never reset it, so it grows every round.
    * After X's ``save_results`` (``../results/<dataset>_<algorithm>_<goal>_<times>.h5``), adds the
      mixin's ``lag_*`` arrays and the settings (attribute ``lag``) to that file.
    * Around X's ``send_models``, keeps every client's copy of the personal layers: upstream's broadcast
      copies the whole global model into each client and cannot leave anything out, so the personal
      tensors (parameters and their modules' buffers) are saved first and put back after it.
    * Delivers what a client receives beyond the broadcast (``personal_payload``: its group's models, with
      ``--lag_share groups``) into its live model, the one way upstream's clients can receive it.
    * Gives the mixin its settings, from the ``--lag_*`` flags in upstream's ``args``, and supplies the hooks
      the mixin extends that upstream's ``Server`` lacks: nothing to add to them (no state, no results, no
      payload, nothing after the rounds); upstream's own loop calls none of them.
    """

    def send_models(self):
        names = self.lag_personal_names()
        if not names:
            return super().send_models()
        import torch
        from flcore.lag.conflict import with_module_buffers
        saved = {c.id: {n: t.detach().clone() for n, t in with_module_buffers(c.model, names).items()}
                 for c in self.clients}
        super().send_models()
        with torch.no_grad():
            for client in self.clients:
                for name, tensor in with_module_buffers(client.model, names).items():
                    tensor.copy_(saved[client.id][name])
    send_models.delivers_payloads = True  # each client ends with its payload: the broadcast and its own layers

    def send_personal_payloads(self, clients=None):
        import torch
        with torch.no_grad():
            for client in self.clients if clients is None else clients:
                own = self.personal_payload(client.id)  # full names: upstream's clients share the whole model
                if own:
                    live = {**dict(client.model.named_parameters()), **dict(client.model.named_buffers())}
                    for name, value in own.items():
                        live[name].copy_(value)

    def personal_names(self):
        return frozenset()

    def personal_payload(self, client_id):
        return None

    def extra_state(self):
        return {}

    def get_state(self):
        return {}

    def set_state(self, state):
        pass

    def result_arrays(self):
        return {}

    def result_attrs(self):
        return {}

    def finish(self):
        pass

    def lag_settings(self):
        from flcore.lag import LagSettings
        settings = LagSettings.from_args(self.args)
        settings.check(getattr(self.args, "global_rounds", None))
        return settings

    def receive_models(self):
        super().receive_models()
        owner_of = {id(p): c for c in self.clients for p in c.model.parameters()}
        by_id = {c.id: c for c in self.clients}
        self.uploads, live = [], True
        for index, module in enumerate(self.uploaded_models):
            owner = owner_of.get(id(next(module.parameters(), None)))
            if owner is None:  # a copy, not the client's own module: upstream's id list says whose
                owner, live = by_id[self.uploaded_ids[index]], False
            self.uploads.append(Upload.of(owner, module))
        if live:  # otherwise they are copies: keep upstream's list
            self.uploaded_ids = [upload.client_id for upload in self.uploads]

    def upload_needs_gradients(self) -> bool:
        return False  # upstream clients leave their last gradients in .grad; Upload.of reads them

    def save_results(self):
        super().save_results()
        path = os.path.join("..", "results", f"{self.dataset}_{self.algorithm}_{self.goal}_{self.times}.h5")
        if not os.path.exists(path):
            print(f"FedLAG: {path} was not written by save_results(); the lag_* arrays are not saved")
            return
        import dataclasses

        import h5py
        import numpy as np
        with h5py.File(path, "a") as hf:
            for key, value in self.lag_results().items():
                if key in hf:
                    del hf[key]
                if key == "lag_layer_names":
                    hf.create_dataset(key, data=np.array(value, dtype=object), dtype=h5py.string_dtype())
                else:
                    hf.create_dataset(key, data=value.cpu().numpy())
            hf.attrs["lag"] = json.dumps(dataclasses.asdict(self.lag))
        print(f"FedLAG: lag_* arrays added to {path}")


class Upload:
    """One upstream upload as the mixin reads it: ``tensors`` and last-minibatch ``gradients`` by their
    names in the client's whole model (so ``full_name`` is the identity)."""
    shared_path = ""

    def __init__(self, client_id: int, tensors: dict, gradients: dict):
        self.client_id, self.tensors, self.gradients = client_id, tensors, gradients

    @staticmethod
    def full_name(name: str) -> str:
        return name

    @classmethod
    def of(cls, client, module) -> "Upload":
        """``module`` (a sub-module of ``client.model``, or a copy of one) named against the whole model:
        by parameter identity, else by the one parameter name it ends with."""
        by_identity = {id(p): n for n, p in client.model.named_parameters()}
        tensors, gradients = {}, {}
        for name, param in module.named_parameters():
            full = by_identity.get(id(param))
            if full is None:
                from flcore.lag import LagError
                matches = [f for f in by_identity.values() if f == name or f.endswith("." + name)]
                if len(matches) != 1:
                    raise LagError(f"cannot tell which parameter of client {client.id}'s model the uploaded "
                                   f"tensor {name!r} is (candidates: {matches or 'none'})")
                full = matches[0]
            tensors[full] = param.detach()
            if param.grad is not None:
                gradients[full] = param.grad.detach()
        return cls(client.id, tensors, gradients)


def compose(server_class: type) -> type:
    """``X+LAG`` for an upstream server class X: ``(UpstreamDelivery, LayerConflictMixin, UpstreamCompat, X)``."""
    from flcore.lag import LagError, LayerConflictMixin
    if issubclass(server_class, LayerConflictMixin):
        raise LagError(f"{server_class.__name__} already personalises conflicting layers")
    glue = type(server_class.__name__, (UpstreamCompat, server_class), {})  # named after X, for messages
    return type(f"{server_class.__name__}_LAG", (UpstreamDelivery, LayerConflictMixin, glue),
                {"__doc__": server_class.__doc__, "lag_base": glue})


# ----- main.py hook ----------------------------------------------------------------------------------
def install_lag(parser, namespace: dict) -> None:
    """main.py's block: add the ``--lag_*`` flags to ``parser`` and put a :class:`LagRun` in place of ``run``."""
    from flcore.lag.settings import add_lag_arguments  # the project's one definition of the flags
    add_lag_arguments(parser.add_argument_group("FedLAG (-algo FedLAG or -algo X+LAG)"))
    if not isinstance(namespace.get("run"), LagRun):  # (a second call changes nothing)
        namespace["run"] = LagRun(namespace.get("run"), namespace)


class LagRun:
    """main.py's ``run(args)``, which also understands ``-algo FedLAG`` and ``-algo X+LAG``."""

    def __init__(self, run, namespace: dict):
        self.run, self.namespace = run, namespace

    def __call__(self, args):
        label = args.algorithm
        base = base_algorithm(label)
        if base is None:
            return self.run(args)
        with open(self.namespace["__file__"], encoding="utf-8") as f:
            branches = dispatch(f.read())
        if label in branches:  # main.py has its own branch for this exact name: it runs
            return self.run(args)
        lag_class = self.server_class(label, base, args, branches)
        scope = dict(self.namespace, **{branches[base]: lag_class})
        run = types.FunctionType(self.run.__code__, scope, self.run.__name__, self.run.__defaults__,
                                 self.run.__closure__)
        lag_args = copy.copy(args)
        lag_args.algorithm = LagName(label, base)
        return run(lag_args)

    def server_class(self, label: str, base: str, args, branches: Dict[str, str]) -> type:
        """The LAG version of the class X's branch builds; checked before any data is read."""
        if base in NO_LAG:
            raise SystemExit(f"-algo {label} is refused: {NO_LAG[base]}, so there are no layers to personalise")
        if base not in branches:
            names = [FEDLAG] * (FEDLAG_BASE in branches)
            names += [n + SUFFIX for n in branches if n not in NO_LAG and base_algorithm(n) is None]
            raise SystemExit(f"-algo {label}: main.py's run() has no branch for {base!r}. LAG names: "
                             + ", ".join(names))
        from flcore.lag import LagError, LagSettings
        try:
            settings = LagSettings.from_args(args)
            settings.check(getattr(args, "global_rounds", None))
        except LagError as err:
            raise SystemExit(f"-algo {label}: {err}") from None
        if settings.upload == "sketch":
            raise SystemExit(f"-algo {label}: --lag_upload sketch is not available in a PFLlib checkout, whose "
                             f"servers average the uploaded models whole; use --lag_upload all")
        original = self.namespace.get(branches[base])
        if not isinstance(original, type):
            raise SystemExit(f"-algo {label}: main.py builds {branches[base]} for {base}, which is not a class there")
        if label == FEDLAG:
            from flcore.servers.serverfedlag import FedLAG
            if original in FedLAG.__bases__:
                return FedLAG
        return compose(original)
