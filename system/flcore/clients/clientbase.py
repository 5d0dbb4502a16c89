"""The client: its data, its model and optimiser, one local-training loop, and its metrics.

Local training is one loop (:meth:`Client.train`) with small hooks, in the style of FedJAX's
``client_init`` / ``client_step`` / ``client_final``:

* :meth:`begin_local_training` - before the first step (e.g. remember the received global model);
* :attr:`objective`            - the minibatch objective (cross-entropy plus any extra term), written
  once for both executors (:mod:`flcore.training.objective`); :meth:`local_loss` runs it on the
  client's own modules, and a client whose loss cannot be written that way overrides ``local_loss``;
* :meth:`after_step`           - after each optimiser step (e.g. a SCAFFOLD-style correction);
* :meth:`end_local_training`   - after the last step.

Whether ``--executor batched`` can train a client class is declared by the class itself, in its own
``batched`` attribute (:mod:`flcore.vmapped.support`); a subclass does not inherit it.

What a client shares is declared, not coded into copy loops: :attr:`shared_path` names the
sub-module it uploads and receives (``""`` = the whole model, ``"base"`` = the feature extractor
of a :class:`BaseHeadSplit`), and :meth:`shares` can exclude single tensors (FedBN's norms).

A client holds no model of its own between uses: its modules are parked as tensors, most of them shared
with other clients (what the server broadcast), and ``self.model`` is a working module checked out
when read (:mod:`flcore.clients.parking`). Methods use ``self.model`` and their own modules as usual.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.algorithm_flags import Hyperparameters
from flcore.clients.parked_modules import FrozenTensors
from flcore.clients.parking import ParkingClient, holds_stand_ins
from flcore.clients.spill_files import SpillRecord
from flcore.config_fields import ConfigField
from flcore.exchange import ClientUpdate
from flcore.state import ModuleTensors, StateError, check_attrs, export_value, import_value
from flcore.training.objective import CrossEntropy, LiveModel, Objective
from utils.client_data import ClientData
from utils.metrics import ClientTestStats, test_stats
from utils.seeding import client_generator

EVAL_BATCH_SIZE = 256
# The key of a client's saved state naming the client-state file that holds its own tensors.
STORED_KEY = "stored_in"


class DivergenceError(RuntimeError):
    """Local training produced a NaN or infinite loss."""

    def __init__(self, client_id: int):
        super().__init__(f"client {client_id} reached a non-finite loss")
        self.client_id = client_id

    def __reduce__(self):
        # Rebuilt from the id, not the message, when it crosses a process boundary (Ray pickles it).
        return type(self), (self.client_id,)


class Client(ParkingClient):
    shared_path: str = ""  # sub-module exchanged with the server; "" is the whole model
    # Attributes beyond the model, optimiser, scheduler and generator that carry state from one
    # round to the next (a personal model, control variates, ...). Checkpoints save them and
    # executors move them; anything not listed must be rebuilt at the start of each round.
    persistent_attrs: Tuple[str, ...] = ()
    # Modules beside ``model`` that are personal layers of the prediction (FedROD's personal head).
    # FedLAG's K counts them with the parameters of ``model`` the method does not share.
    personal_layer_attrs: Tuple[str, ...] = ()
    # Held out of the train data by --val_ratio (set by the server), for choosing the best round.
    val_data: Optional[ClientData] = None
    # What local training minimises; an algorithm with its own sets it in setup() from its hyper-parameters.
    objective: Objective = CrossEntropy()

    # PFLlib's names for the flags a client reads, as views of ``self.config``.
    num_classes = ConfigField()
    batch_size = ConfigField()
    learning_rate = ConfigField("local_learning_rate")
    local_epochs = ConfigField()
    learning_rate_decay = ConfigField()
    learning_rate_decay_gamma = ConfigField()

    def __init__(self, config, hparams: Hyperparameters, id: int, train_data: ClientData, test_data: ClientData,
                 model: nn.Module):
        """``config``: the run's flags (:class:`~app.config.RunConfig`); ``hparams``: what its algorithm takes
        (both set first: ``make_optimizer`` may read them). Ends with :meth:`setup`."""
        self._start_parking()
        self.config = config
        self.hparams = hparams
        self.id = id
        self.train_data = train_data
        self.test_data = test_data
        self.train_samples = len(train_data)
        self.test_samples = len(test_data)
        self.hold_copy("model", model)
        self.check_out()  # in use while it is built: the server parks it then
        self.loss = nn.CrossEntropyLoss()
        self.optimizer = self.make_optimizer(self.model.parameters())
        self.learning_rate_scheduler = self.make_scheduler(self.optimizer)
        # The client's own generator: batch order does not depend on which clients ran before it.
        self.generator = client_generator(config.seed, id)
        self.setup()

    def setup(self) -> None:
        """What an algorithm adds once the base client is built: its hyper-parameters as attributes
        (``self.hparams``), its own models and state. Overriding ``__init__`` is needed only for work
        that must come first (e.g. splitting the train data)."""

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.learning_rate)

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.ExponentialLR:
        """The -ld decay of ``optimizer``'s learning rate (stepped once per local training when -ld is on)."""
        return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=self.learning_rate_decay_gamma)

    # ----- what is exchanged with the server -------------------------------------------------
    def shared_module(self) -> nn.Module:
        return self.model.get_submodule(self.shared_path)

    def shares(self, name: str) -> bool:
        """Whether tensor ``name`` (relative to :meth:`shared_module`) is exchanged."""
        return True

    def set_parameters(self, broadcast: Mapping[str, torch.Tensor]) -> None:
        """Receive the server's ``broadcast``: tensors by name, relative to :meth:`shared_module` (the global
        counterpart of what this client shares). A :class:`~flcore.clients.parking.FrozenTensors` broadcast
        is shared, not copied, by the clients that leave it unchanged."""
        prefix = f"{self.shared_path}." if self.shared_path else ""
        received = {prefix + name: t for name, t in broadcast.items() if self.shares(name)}
        self.receive_tensors(received, frozen=isinstance(broadcast, FrozenTensors))

    def upload(self) -> ClientUpdate:
        """This round's upload: the shared tensors (views, not copies), the last minibatch's gradients,
        and :meth:`upload_extras`."""
        module = self.shared_module()
        tensors = {name: t.detach() for name, t in named_tensors(module).items() if self.shares(name)}
        gradients = {name: p.grad.detach() for name, p in module.named_parameters()
                     if p.grad is not None and name in tensors}
        return ClientUpdate(self.id, self.train_samples, tensors, self.shared_path, gradients, self.upload_extras())

    def shared_tensors(self) -> dict:
        """What this client's uploads carry, by name relative to :meth:`shared_module`, without checking
        its model out (never write them)."""
        prefix = f"{self.shared_path}." if self.shared_path else ""
        shared = {n[len(prefix):]: t for n, t in self.module_tensors().items() if n.startswith(prefix)}
        return {name: t for name, t in shared.items() if self.shares(name)}

    def upload_extras(self) -> dict:
        """What the algorithm uploads besides parameters (a control delta, prototypes, ...), by name."""
        return {}

    # ----- state (checkpoints, executors) -------------------------------------------------------
    def state_names(self) -> Tuple[str, ...]:
        """The attributes :meth:`get_state` saves and :meth:`set_state` restores (nothing else)."""
        return ("model", "optimizer", "learning_rate_scheduler", "generator") + tuple(self.persistent_attrs)

    def get_state(self) -> dict:
        """The attributes of :meth:`state_names` as plain values (parked modules without copies). A client
        whose own tensors are in the client-state store is saved as it is: stand-ins, and the file's record
        under :data:`STORED_KEY` (:mod:`flcore.clients.state_store`)."""
        state = {name: export_value(self._state_value(name)) for name in self.state_names()}
        record = self.spill_record()
        if record is not None:
            state[STORED_KEY] = record.as_state()
        return state

    def check_state(self, state: object, where: str = "") -> None:
        """Raise :class:`~flcore.state.StateError` unless ``state`` fits this client; changes nothing."""
        state, record = self._split_stored(state, where)
        check_attrs(_StateView(self), state, self.state_names(), where)
        if record is None and holds_stand_ins(state):
            raise StateError(f"{where or 'client'}: holds tensors without values and names no client-state file")

    def set_state(self, state: dict) -> None:
        """Load :meth:`get_state`'s output, checked in full first; modules and optimisers are updated in
        place, a parked module keeps the saved tensors themselves."""
        self.check_state(state)
        state, record = self._split_stored(state)
        was_parked = not self.needs_parking()
        self._take()  # what it owns now, out of the store: the loaded values replace it
        for name in self.state_names():
            value = import_value(self._state_value(name), state[name])
            if isinstance(value, ModuleTensors):
                self.load_module_state(name, value)
            else:
                setattr(self, name, value)
        if record is not None:
            self.restore_spilled(record)
        elif was_parked:  # as it was: its own tensors back in the store
            self.park()

    def _split_stored(self, state: object, where: str = ""):
        """``(state without the store's record, the record or None)``; the record's file checked."""
        if not isinstance(state, dict) or STORED_KEY not in state:
            return state, None
        state = dict(state)
        try:
            record = SpillRecord.from_state(state.pop(STORED_KEY))
        except ValueError as err:
            raise StateError(f"{where or 'client'}.{STORED_KEY}: {err}") from None
        problem = self._store.files.problem(record)
        if problem:
            raise StateError(f"{where or 'client'}: {problem}")
        return state, record

    def _state_value(self, name: str):
        """Attribute ``name``, a parked module as its :class:`~flcore.state.ModuleTensors` (not checked out),
        a spilled attribute as its stand-in (not read back)."""
        parked = self.module_state(name)
        if parked is not None:
            return ModuleTensors(parked)
        if name in self.__dict__:
            return self.__dict__[name]
        held = self.own_attribute(name)  # in the client-state store while parked
        return held if held is not None else getattr(self, name)

    # ----- local training ---------------------------------------------------------------------
    def train(self) -> ClientUpdate:
        """One round of local training; returns the round's upload (:meth:`upload`)."""
        self.local_training()
        return self.upload()

    def local_training(self) -> None:
        """The local training itself: one loop with the hooks below. Methods with several stages
        (FedRep's head then body, pFedMe's inner problem) override this."""
        self.model.train()
        self.begin_local_training()
        self.run_epochs(self.local_epochs, self.local_loss)
        if self.learning_rate_decay:
            self.learning_rate_scheduler.step()
        self.end_local_training()

    def run_epochs(self, epochs: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   optimizer: torch.optim.Optimizer | None = None) -> None:
        """The minibatch SGD loop shared by training, fine-tuning and multi-stage methods."""
        optimizer = optimizer or self.optimizer
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.train_data.y.device)
        for _ in range(epochs):
            for x, y in self.train_data.train_batches(self.batch_size, self.generator):
                loss = loss_fn(x, y)
                # Accumulated rather than checked per step: no device synchronisation per batch.
                nonfinite |= ~torch.isfinite(loss.detach())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                self.after_step()
        if bool(nonfinite):
            raise DivergenceError(self.id)

    def begin_local_training(self) -> None:
        pass

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The minibatch loss :meth:`local_training` steps on: :attr:`objective` on this client's own modules."""
        return self.objective(LiveModel(self), x, y)

    def after_step(self) -> None:
        pass

    def end_local_training(self) -> None:
        pass

    def fine_tune(self, epochs: int) -> None:
        """Plain cross-entropy SGD on the whole model (new clients, PFLlib's ``-ften``)."""
        self.model.train()
        self.run_epochs(epochs, lambda x, y: self.loss(self.model(x), y))

    def take_data(self, train_data: ClientData, test_data: ClientData,
                  val_data: Optional[ClientData] = None) -> None:
        """Give the client its splits as the run reads them from its files: a worker away from the server
        does, for a client shipped without its data. A client that cuts its own parts from them (FedFomo's
        validation part) overrides this to cut them as its constructor did."""
        self.train_data, self.test_data, self.val_data = train_data, test_data, val_data

    # ----- metrics ----------------------------------------------------------------------------
    def evaluation_model(self) -> nn.Module:
        """The model whose test accuracy is reported for this client."""
        return self.model

    @torch.inference_mode()
    def test_metrics(self, data: Optional[ClientData] = None, model: Optional[nn.Module] = None) -> ClientTestStats:
        """Accuracy and AUC of ``model`` (default: :meth:`evaluation_model`) on ``data`` (default: the test
        set; the server passes the validation set)."""
        model = self.evaluation_model() if model is None else model
        model.eval()
        return test_stats(*self._predict(model, self.test_data if data is None else data))

    @torch.inference_mode()
    def train_metrics(self, model: Optional[nn.Module] = None) -> Tuple[float, int]:
        """(sum of per-sample losses, number of samples) of ``model`` (default: :meth:`evaluation_model`)
        on the train set, in eval mode."""
        model = self.evaluation_model() if model is None else model
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.train_data.y.device)
        for x, y in self.train_data.eval_batches(EVAL_BATCH_SIZE):
            total += nn.functional.cross_entropy(model(x), y, reduction="sum").double()
        return float(total), self.train_samples

    def _predict(self, model: nn.Module, data: ClientData) -> Tuple[torch.Tensor, torch.Tensor]:
        outputs = [model(x) for x, _ in data.eval_batches(EVAL_BATCH_SIZE)]
        return torch.cat(outputs), data.y


class _StateView:
    """A client's state attributes as :func:`~flcore.state.check_attrs` reads them, parked modules unread."""

    def __init__(self, client: Client):
        self._client = client

    def __getattr__(self, name: str):
        return self._client._state_value(name)

