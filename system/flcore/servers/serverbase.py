"""The algorithm contract: what a federated method does in one round, as hooks a method overrides.

A round, as :class:`~app.run.FederatedRun` drives it (the loop, checkpoints, resume and results live
there, not here)::

    select_clients -> send_models -> evaluate (every eval_gap) -> train_clients(selected)
    -> receive_models -> aggregate_parameters -> end_round -> drop_uploads

An algorithm overrides only the hooks it changes, in the spirit of Flower's ``Strategy``
(``configure_train`` / ``aggregate_train``), and declares the attributes that carry its state from one
round to the next (:attr:`Server.persistent_attrs`). Training returns values: ``train_clients`` keeps
each trained client's :class:`~flcore.exchange.ClientUpdate`, ``receive_models`` picks the round's
``uploads`` (after ``-cdr`` drop-out and ``-ts``'s time-based selection) and their ``upload_weights``,
and aggregation reads only those. What a client's model receives is one value, :meth:`Server.payload`
(the broadcast, and what it alone or its group gets), which the base ``send_models`` delivers (a method
that sends more, a control variate or a generator, does so in its own ``send_models``).
PFLlib's names are kept where they mean the same thing (``clients``, ``selected_clients``,
``global_model``, ``rs_test_acc`` ...); its ``uploaded_ids`` / ``uploaded_models`` contract (live
modules of the clients) exists only in the adapter that runs FedLAG inside a PFLlib checkout (``patches/``).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Type

import numpy as np
import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors, sample_weights, weighted_average
from flcore.algorithm_flags import Hyperparameters
from flcore.clients.clientbase import Client
from flcore.clients.parked_modules import FrozenTensors, frozen_copy_of
from flcore.clients.state_store import ClientStateStore
from flcore.client_time import SimulatedTime
from flcore.config_fields import ConfigField
from flcore.exchange import ClientUpdate, TensorSpec, magnitude_limit, tensor_spec, update_problem
from flcore.executors.sequential import SequentialExecutor
from flcore.lag.settings import LagSettings
from flcore.privacy.leakage import LeakageEvaluation
from flcore.registry import uploads_parameters
from flcore.state import check_server_state, export_attrs, import_attrs
from utils import progress
from utils.client_data import client_splits
from utils.datasets import DatasetInfo
from utils.memory_release import release_free_memory
from utils.metrics import Summary, summarize, validation_accuracy
from utils.seeding import evaluation_sample, sampler_rng

RELEASE_EVERY = 64  # clients built between two returns of freed memory to the system


class Server:
    client_class: Type[Client] = Client
    # Server attributes that carry state across rounds (control variates, stored models, ...),
    # besides the global model, the sampler, the round counter and the history.
    persistent_attrs: tuple = ()
    # Why this server needs every tensor a client shares in each upload, beyond averaging what arrives (None:
    # it does not); FedLAG's --lag_upload sketch, which keeps the personal layers' tensors home, is refused.
    whole_uploads_needed: Optional[str] = None

    # PFLlib's names for the flags a server reads, as views of ``self.config``.
    dataset = ConfigField()
    algorithm = ConfigField()
    goal = ConfigField()
    num_classes = ConfigField()
    few_shot = ConfigField()
    global_rounds = ConfigField()
    eval_gap = ConfigField()
    num_clients = ConfigField()
    join_ratio = ConfigField()
    random_join_ratio = ConfigField()
    client_drop_rate = ConfigField()
    train_slow_rate = ConfigField()
    send_slow_rate = ConfigField()
    time_select = ConfigField()
    time_threthold = ConfigField()
    auto_break = ConfigField()
    top_cnt = ConfigField()
    num_new_clients = ConfigField()
    fine_tuning_epoch_new = ConfigField()

    def __init__(self, config, hparams: Hyperparameters, times: int, model: nn.Module, data: DatasetInfo,
                 store: Optional[ClientStateStore] = None):
        """``config``: this run's flags (seeded for run ``times``); ``hparams``: what the algorithm takes
        (its registry row's dataclass), which its clients receive too; ``store``: the table of what its
        clients own (the run's, with its ``--state_memory`` budget and folder; default: one without a
        budget). Ends with :meth:`setup`."""
        self.config = config
        self.hparams = hparams
        self.times = times
        self.device = torch.device(config.device)
        self.data_info = data
        self.global_model = model.to(self.device)
        self.sampler = sampler_rng(config.seed)
        self.state_store = store if store is not None else ClientStateStore()  # what clients own
        self.clients: List[Client] = self.set_clients(range(self.num_clients))
        self.sim_time = SimulatedTime(config, self.num_clients)  # -tsr, -ssr, -ts, -tth (draws on its own streams)
        # -dlg (draws on its own streams); a method whose clients upload no parameters has nothing to attack.
        self.leakage = LeakageEvaluation(config, active=config.dlg_eval and uploads_parameters(config.algorithm))
        self.executor = SequentialExecutor()  # the run puts --executor's in place for the rounds' duration
        self.new_clients: List[Client] = []
        self.selected_clients: List[Client] = []
        self.trained_updates: Dict[int, ClientUpdate] = {}  # this round's updates, by client id
        self.uploads: List[ClientUpdate] = []               # those that reached the server (-cdr)
        self.upload_weights: List[float] = []
        self.rejected_updates: List[dict] = []              # {"round", "client", "reason"} of each left out
        self._upload_specs: Dict[int, TensorSpec] = {}      # client id -> what its uploads carry
        self._evaluation_ids: Optional[np.ndarray] = None   # --eval_clients' sample, drawn at first use

        self.current_round = 0  # set by the run that drives the rounds
        # Every recorded series, by its name in the .h5 file; algorithms add their own via record().
        self.history: Dict[str, list] = {name: [] for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss",
                                                               "rs_client_acc", "rs_eval_round", "rs_round_time")}
        self._bind_history()
        self.setup()

    def setup(self) -> None:
        """What an algorithm adds once the base server and its clients are built (it reads ``self.hparams``).
        Overriding ``__init__`` is needed only for work that must come first (e.g. wrapping the model)."""

    def _bind_history(self) -> None:
        """PFLlib's attribute names for the three classic series."""
        self.rs_test_acc: List[float] = self.history["rs_test_acc"]
        self.rs_test_auc: List[float] = self.history["rs_test_auc"]
        self.rs_train_loss: List[float] = self.history["rs_train_loss"]

    @property
    def num_join_clients(self) -> int:
        """Clients selected per round (PFLlib's name): ``-jr`` of ``-nc``, at least one."""
        return max(1, int(self.num_clients * self.join_ratio))

    def lag_settings(self) -> LagSettings:
        """The ``--lag_*`` values, for ``X+LAG`` (:class:`LayerConflictMixin` asks every server for them)."""
        return self.config.lag

    # ----- set-up ------------------------------------------------------------------------------
    def set_clients(self, ids: Sequence[int]) -> List[Client]:
        """Create clients ``ids``, each with its data (read once, laid out for the model), modules parked."""
        clients = []
        for count, i in enumerate(ids, 1):
            train, test, val = client_splits(self.data_info, i, self.config, self.global_model)
            client = self.client_class(self.config, self.hparams, i, train, test, self.global_model)
            client.val_data = val
            client.use_store(self.state_store)
            client.park()
            clients.append(client)
            if count % RELEASE_EVERY == 0 or count == len(ids):
                release_free_memory()  # a client's set-up copies, freed, are not kept (utils/memory_release.py)
        return clients

    # ----- the round loop ----------------------------------------------------------------------
    def select_clients(self) -> List[Client]:
        count = self.num_join_clients
        if self.random_join_ratio:
            count = int(self.sampler.integers(self.num_join_clients, self.num_clients + 1))
        ids = np.sort(self.sampler.choice(self.num_clients, size=count, replace=False))
        return [self.clients[i] for i in ids]

    def global_shared_module(self) -> nn.Module:
        """The part of the global model that clients receive (their :meth:`Client.shared_module`)."""
        return self.global_model.get_submodule(self.client_class.shared_path)

    def shared_tensors(self) -> Dict[str, torch.Tensor]:
        """The global shared module's tensors, by name relative to it (views): the global counterpart of
        what clients share, personal layers included (what a new client starts from)."""
        return named_tensors(self.global_shared_module())

    def personal_names(self) -> FrozenSet[str]:
        """Full names of the tensors every client keeps as its own this round besides what its method
        never shares: none here; ``X+LAG``'s personal layers, with their modules' buffers."""
        return frozenset()

    def broadcast(self) -> Dict[str, torch.Tensor]:
        """What every client's :meth:`payload` starts from: :meth:`shared_tensors` less the
        :meth:`personal_names`, by name relative to the shared module (views). A name left out is the
        client's own: it is never loaded, so nothing has to be put back."""
        shared = self.shared_tensors()
        personal = self.personal_names()
        if not personal:
            return shared
        path = self.client_class.shared_path
        return {name: t for name, t in shared.items() if (f"{path}.{name}" if path else name) not in personal}

    # ----- what a client receives: one way in ----------------------------------------------------------
    _sent: Optional[dict] = None  # while a delivery is under way: each payload made for it, by key

    def payload(self, client_id: int) -> Mapping[str, torch.Tensor]:
        """What client ``client_id`` receives at :meth:`send_models`, by name relative to the shared module:
        the :meth:`broadcast`, with its :meth:`personal_payload` on top where it has one. Frozen tensors: the
        clients that receive the same tensors share one copy of them (the broadcast's, for most: one copy
        for every client, as in PFLlib; one per group of ``X+LAG --lag_share groups``; one per cluster)."""
        path = self.client_class.shared_path
        shared = self._sent_once("broadcast", lambda: frozen_copy_of(self.broadcast(), path))
        own = self.personal_payload(client_id)
        if not own:
            return shared
        return self._sent_once(("with", id(own)), lambda: (own, FrozenTensors({**shared, **own})))[1]

    def personal_payload(self, client_id: int) -> Optional[Mapping[str, torch.Tensor]]:
        """What client ``client_id`` receives beyond the broadcast, by name relative to the shared module
        (``X+LAG``'s group models of the personal layers), or None: nothing here. Tensors nobody writes any
        more; one object for all the clients that receive the same (they then share one copy)."""
        return None

    def send_models(self) -> None:
        """Every client (selected or not) receives its :meth:`payload`."""
        with self.sending():
            for client in self.clients:
                client.set_parameters(self.payload(client.id))
    send_models.delivers_payloads = True  # X+LAG reads it: an override may deliver something else

    def send_personal_payloads(self, clients: Optional[Sequence[Client]] = None) -> None:
        """Each client (default: every one) receives only its :meth:`personal_payload`: what must reach it
        where no broadcast is due (before :meth:`finish` and the new clients read the clients), or ahead of
        a method's own ``send_models`` that delivers no payloads (it leaves personal layers out)."""
        with self.sending():
            for client in self.clients if clients is None else clients:
                own = self.personal_payload(client.id)
                if own:
                    client.set_parameters(self._sent_once(("only", id(own)), lambda: (own, FrozenTensors(own)))[1])

    @contextmanager
    def sending(self) -> Iterator[None]:
        """A delivery: within it each distinct payload is made once, for all the clients that receive it
        (outside one, :meth:`payload` makes it afresh at every call)."""
        if self._sent is not None:  # within another delivery: its payloads serve
            yield
            return
        self._sent = {}
        try:
            yield
        finally:
            self._sent = None

    def _sent_once(self, key, make: Callable[[], object]):
        """``make()`` once per ``key`` within :meth:`sending` (the value is held until it ends, so an object's
        id in a key cannot be reused meanwhile)."""
        if self._sent is None:
            return make()
        if key not in self._sent:
            self._sent[key] = make()
        return self._sent[key]

    def train_clients(self, clients: Sequence[Client]) -> None:
        """The one place that decides how selected clients run (``--executor``: in turn, batched, on Ray);
        keeps their updates for :meth:`receive_models`."""
        self.state_store.uploading(client.id for client in clients)
        self.trained_updates = {u.client_id: u for u in self.executor.train(clients)}

    def drop_uploads(self) -> None:  # after the round: its updates, a model per trained client, are spent
        self.trained_updates, self.uploads = {}, []
        self.state_store.uploaded()

    def upload_needs_gradients(self) -> bool:
        """Whether uploads must carry the last minibatch's gradients (FedLAG's ``last_batch`` signal);
        executors that move updates between processes drop them otherwise."""
        return False

    def receive_models(self) -> None:
        """The updates of the selected clients that were not dropped (``-cdr``), and their sample weights."""
        active = self.selected_clients
        if self.client_drop_rate > 0:
            keep = int((1 - self.client_drop_rate) * len(active))
            picks = np.sort(self.sampler.choice(len(active), size=keep, replace=False))
            active = [active[i] for i in picks]
        active = self.on_time(active)
        limit = magnitude_limit(self.shared_tensors())
        self.uploads = [u for u in (self.trained_updates[c.id] for c in active) if self.accepts(u, limit)]
        self.upload_weights = sample_weights([u.num_samples for u in self.uploads])

    def on_time(self, active: List[Client]) -> List[Client]:
        """``active`` less the clients ``-ts`` leaves out, their simulated time above ``-tth``
        (:mod:`flcore.client_time`); with any of ``-tsr``, ``-ssr``, ``-ts`` it records the round's simulated
        times too (``rs_sim_train_time``, ``rs_sim_send_time``: one value per client, NaN training time for
        those not trained; ``rs_time_left_out``: 1 for each client left out; ``rs_sim_round_time``: the
        largest training plus sending time among the clients kept). Without them it changes nothing."""
        if not self.sim_time.active:
            return active
        trained = {c.id: c.train_samples for c in self.selected_clients}  # train_clients trains them all
        train, send = self.sim_time.round_rows(self.current_round, trained)
        self.record("rs_sim_train_time", train)
        self.record("rs_sim_send_time", send)
        times = self.sim_time.client_times(self.history["rs_sim_train_time"], self.history["rs_sim_send_time"])
        left = self.sim_time.left_out(times, [c.id for c in active]) or set()
        kept = [c for c in active if c.id not in left]
        mask = np.zeros(self.num_clients, dtype=np.int64)
        mask[sorted(left)] = 1
        self.record("rs_time_left_out", mask)
        self.record("rs_sim_round_time", max((float(train[c.id] + send[c.id]) for c in kept), default=0.0))
        return kept

    def accepts(self, update: ClientUpdate, limit: Optional[float] = None) -> bool:
        """Whether ``update`` may be averaged (:func:`~flcore.exchange.update_problem`: what was shared,
        finite, a plausible sample count; then :meth:`extras_problem`). One that may not is left out of the
        round, named on stderr and listed in the results (``rejected_updates``): one bad client never
        poisons the average."""
        client = self.clients[update.client_id] if update.client_id < len(self.clients) else None
        if client is None or client.id != update.client_id:
            problem = f"it names client {update.client_id}, which is not in the run"
        else:
            problem = update_problem(update.tensors, self._upload_spec(client), update.num_samples,
                                     client.train_samples, update.gradients, limit) or self.extras_problem(update)
        if problem is None:
            return True
        self.rejected_updates.append({"round": self.current_round, "client": update.client_id, "reason": problem})
        print(f"warning: round {self.current_round}: the update of client {update.client_id} is left out of the "
              f"average: {problem}", file=sys.stderr)
        return False

    def extras_problem(self, update: ClientUpdate) -> Optional[str]:
        """Why the algorithm's own part of ``update`` (its ``extras``) cannot be used, or None; an algorithm
        whose server reads an extra checks it here (IFCA's cluster index)."""
        return None

    def _upload_spec(self, client: Client) -> TensorSpec:
        """The names, shapes and dtypes ``client``'s uploads carry (what it shares), from its own model."""
        if client.id not in self._upload_specs:
            self._upload_specs[client.id] = tensor_spec(client.shared_tensors())
        return self._upload_specs[client.id]

    def uploader_ids(self) -> List[int]:
        """The ids of this round's uploaders, in upload order."""
        return [u.client_id for u in self.uploads]

    def aggregate_parameters(self) -> None:
        """Sample-weighted average of the uploads (parameters and buffers) into the global model."""
        if not self.uploads:
            return
        copy_into(self.global_shared_module(), self.average_uploads())

    def average_uploads(self, weights: Optional[Sequence[float]] = None) -> Dict[str, torch.Tensor]:
        """Average of the uploads' shared tensors by name, weighted by ``weights`` (default: by samples)."""
        weights = self.upload_weights if weights is None else weights
        return weighted_average([u.tensors for u in self.uploads], weights)

    def end_round(self, rnd: int) -> None:
        """Extra per-round server step (after aggregation); nothing by default."""

    # ----- privacy evaluation (-dlg) -------------------------------------------------------------
    def leakage_due(self) -> bool:
        """Whether ``-dlg`` attacks this round's uploads (every ``-dlgg`` rounds, round 0 included)."""
        return self.leakage.due(self.current_round)

    def remember_payloads(self) -> None:
        """Right after :meth:`send_models`, in a round :meth:`leakage_due`: what each selected client was sent,
        the start the attacker assumes (:mod:`flcore.privacy.leakage`)."""
        with self.sending():  # the clients that were sent the same tensors share one copy of them
            self.leakage.remember({client.id: self.payload(client.id) for client in self.selected_clients})

    def evaluate_leakage(self) -> str:
        """After :meth:`receive_models`, in a round :meth:`leakage_due`: attack every upload received, record
        ``rs_dlg_round``, ``rs_dlg_psnr``, ``rs_dlg_ssim``, ``rs_dlg_batches``, ``rs_dlg_tensors`` and
        ``rs_dlg_seen``, and return the round's line. Reads only the uploads, the global model and the
        clients' training data; changes none of them."""
        progress.current().begin("DLG attack", len(self.uploads))
        leakage = self.leakage.attack_round(self.current_round, self.global_model, self.client_class.shared_path,
                                            self.uploads, {c.id: c.train_data for c in self.clients})
        for name, value in (("round", self.current_round), ("psnr", leakage.psnr), ("ssim", leakage.ssim),
                            ("batches", leakage.batches), ("tensors", leakage.tensors), ("seen", leakage.seen)):
            self.record(f"rs_dlg_{name}", value)
        return leakage.line(self.current_round, len(self.uploads))

    def finish(self) -> None:
        """Extra step after the last round (e.g. FedBABU's fine-tuning); nothing by default."""

    # ----- evaluation --------------------------------------------------------------------------
    def evaluation_clients(self) -> List[Client]:
        """Every client, or with ``--eval_clients K`` the same K at every evaluation, drawn once from the
        seed on a stream of their own (training draws what it draws without the option)."""
        wanted = self.config.eval_clients
        if not wanted or wanted >= len(self.clients):
            return self.clients
        if self._evaluation_ids is None:
            self._evaluation_ids = evaluation_sample(self.config.seed, len(self.clients), wanted)
        return [self.clients[i] for i in self._evaluation_ids]

    def evaluate(self, clients: Optional[Sequence[Client]] = None, prefix: str = "rs",
                 model_of: Optional[Callable[[Client], nn.Module]] = None) -> Summary:
        """Sample-weighted test accuracy/AUC and train loss (PFLLIB.md section 6) over ``clients`` (default:
        :meth:`evaluation_clients`), of each client's :meth:`~Client.evaluation_model` or of
        ``model_of(client)`` (Ditto's global model)."""
        clients = self.evaluation_clients() if clients is None else clients
        progress.current().begin("evaluate", len(clients))
        results = self.executor.evaluate_clients(clients, model_of)
        summary = summarize([r.test for r in results], [r.train_loss_sum for r in results],
                            [r.train_samples for r in results])
        self.record(f"{prefix}_test_acc", summary.accuracy)
        self.record(f"{prefix}_test_auc", summary.auc)
        self.record(f"{prefix}_train_loss", summary.train_loss)
        if prefix == "rs_after":  # the round's trained clients: which ones changes from round to round
            self.record("rs_after_clients", len(clients))
        else:
            self.record(f"{prefix}_client_acc", summary.client_accuracy)
        if prefix == "rs":
            self.record("rs_eval_round", self.current_round)
            if self.config.val_ratio > 0:
                self.record("rs_val_acc", validation_accuracy(self.in_use(clients), model_of))
        return summary

    def record(self, name: str, value) -> None:
        self.history.setdefault(name, []).append(value)

    def evaluate_new_clients(self) -> Summary:
        """Clients never seen in training (ids -nc .. -nc + -nnc - 1) get what :meth:`receive_new_client`
        gives, fine-tune ``-ften`` epochs their client's way (:meth:`Client.fine_tune`), and are tested."""
        self.new_clients = self.set_clients(range(self.num_clients, self.num_clients + self.num_new_clients))
        for client in self.in_use(self.new_clients):
            self.receive_new_client(client)
        self.fine_tune_clients(self.new_clients, self.fine_tuning_epoch_new, "fine-tune new clients")
        return self.evaluate(self.new_clients, prefix="rs_new")

    def receive_new_client(self, client: Client) -> None:
        """What a new client receives before fine-tuning: the global counterpart of its shared module. Methods
        whose newcomers get something else (nothing, a mean of personal models, server state) override this."""
        client.set_parameters(self.shared_tensors())

    @staticmethod
    def in_use(clients: Sequence[Client]):
        """``clients``, each checked out as it comes: for a hook that calls what reads or trains a client's
        modules (the run parks every client again after the hook)."""
        for client in clients:
            client.check_out()
            yield client

    @staticmethod
    def fine_tune_clients(clients: Sequence[Client], epochs: int, stage: str = "fine-tune") -> None:
        """``client.fine_tune(epochs)`` for each client, shown as a stage of the live progress line."""
        progress.current().begin(stage, len(clients))
        for client in clients:
            client.check_out()
            client.fine_tune(epochs)
            client.park()
            progress.current().advance()

    # ----- state (checkpoints) -----------------------------------------------------------------
    def state_names(self) -> tuple:
        """The server attributes :meth:`get_state` saves and :meth:`set_state` restores (nothing else)."""
        return ("global_model", "sampler", "current_round", "history", "rejected_updates") + tuple(self.persistent_attrs)

    def get_state(self) -> dict:
        """Everything needed to continue the run: server attributes and every client's state."""
        state = export_attrs(self, self.state_names())
        state["clients"] = [client.get_state() for client in self.clients]
        return state

    def check_state(self, state: object) -> None:
        """Raise :class:`~flcore.state.StateError` unless ``state`` (a :meth:`get_state` output) fits this
        server; changes nothing."""
        check_server_state(self, state, self.extra_state())

    def extra_state(self) -> dict:
        """State a mixin adds to :meth:`get_state`, each under its own key, with its live value (what a saved
        one is checked against): none here; ``X+LAG`` extends it with ``"lag"``."""
        return {}

    def set_state(self, state: dict) -> None:
        """Load :meth:`get_state`'s output; checked in full first, so a state that does not fit changes nothing."""
        self.check_state(state)
        state = dict(state)
        for client, client_state in zip(self.clients, state.pop("clients")):
            client.set_state(client_state)
            client.park()
        import_attrs(self, state, self.state_names())
        self._bind_history()

    # ----- results -----------------------------------------------------------------------------
    def result_arrays(self) -> Dict[str, np.ndarray]:
        """Everything saved to the run's .h5 (``rs_eval_clients`` under ``--eval_clients``); subclasses extend it."""
        arrays = {name: np.asarray(values) for name, values in self.history.items()}
        if len(self.evaluation_clients()) < len(self.clients):
            arrays["rs_eval_clients"] = np.asarray([c.id for c in self.evaluation_clients()], dtype=np.int64)
        return arrays

    def result_attrs(self) -> Dict[str, object]:
        """What the .h5 records of the run besides its flags; subclasses and mixins extend it."""
        rejected = {"rejected_updates": list(self.rejected_updates)} if self.rejected_updates else {}
        return {"run": self.times, "algorithm": self.algorithm, "dataset": self.dataset,
                "rounds_done": len(self.history["rs_round_time"]), **rejected}
