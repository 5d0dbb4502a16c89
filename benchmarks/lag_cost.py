"""Server-side cost of FedLAG's conflict analysis: scaling, Gram vs pairwise loop, share of a round.

    python benchmarks/lag_cost.py                 # scaling + Gram vs loop (synthetic updates)
    python benchmarks/lag_cost.py --round-share   # also a real round on MNIST/CNN (needs dataset/MNIST)

1. Scaling: m clients and a model of P parameters split into layers the shape of FedAvgCNN's; the time
   of what the mixin runs every round (starting rows, in-place updates, one Gram matrix per layer on
   column views). The issue's bar: 100 clients x 1M parameters well under a second on this CPU.
2. Gram matrix vs a Python loop over client pairs (the authors' ``pair_cos``), same inputs, as a ratio.
3. With ``--round-share``: one FedLAG round on MNIST (20 clients, CNN, batch 10) with the mixin's hooks
   timed, as a fraction of the whole round. ``--groups`` runs it with ``--lag_share groups`` (scoring,
   profiles, grouping and the averages within groups), and ``--data`` / ``--clients`` another split, e.g.
   ``--data Digits-iid-lg4 --clients 40 --groups`` (the embedded concept shift, where a round is shortest).
4. With ``--groups``: the grouping alone (profiles of a FedAvgCNN head, average linkage) against the
   number of clients.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

import torch  # noqa: E402

from flcore.lag.conflict import conflict_scores_in_spans  # noqa: E402

# FedAvgCNN on CIFAR-10 (0.88M parameters): tensor sizes in named_parameters() order.
CNN_LAYERS = [2400, 32, 51200, 64, 819200, 512, 5120, 10]


def synthetic_clients(num_clients: int, total_params: int, seed: int = 0):
    """Per-client parameter lists with FedAvgCNN's layer proportions, scaled to ``total_params``."""
    scale = total_params / sum(CNN_LAYERS)
    sizes = [max(1, int(s * scale)) for s in CNN_LAYERS]
    g = torch.Generator().manual_seed(seed)
    clients = [[torch.randn(s, generator=g) for s in sizes] for _ in range(num_clients)]
    spans, start = [], 0
    for size in sizes:
        spans.append([(start, start + size)])
        start += size
    return clients, spans, start


def mixin_round(before, after, spans, width):
    """What LayerConflictMixin does per round: starting rows at the broadcast, updates in place at
    upload (theta_after - theta_start), then one Gram matrix per layer on column views."""
    matrix = torch.empty(len(before), width)
    for row, params in enumerate(before):
        torch.cat(params, out=matrix[row])
    for row, params in enumerate(after):
        matrix[row].sub_(torch.cat(params)).neg_()
    return conflict_scores_in_spans(matrix, spans, 0.0)


def best_time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def pairwise_loop_scores(layer_updates, xi: float):
    """The authors' formulation: one cosine per client pair and layer, in Python."""
    scores = []
    for rows in layer_updates:
        count = 0
        for u, v in itertools.combinations(range(rows.shape[0]), 2):
            if torch.nn.functional.cosine_similarity(rows[u], rows[v], dim=0) < xi:
                count += 1
        scores.append(count)
    return scores


def scaling() -> None:
    print(f"conflict analysis per round, as the mixin runs it ({torch.get_num_threads()} threads; best of 3)")
    print(f"{'clients':>8}{'params':>12}{'seconds':>10}")
    for clients, params in [(20, 1_000_000), (50, 1_000_000), (100, 1_000_000), (100, 250_000), (100, 4_000_000)]:
        before, spans, width = synthetic_clients(clients, params, seed=0)
        after, _, _ = synthetic_clients(clients, params, seed=1)
        seconds = best_time(lambda: mixin_round(before, after, spans, width))
        print(f"{clients:>8}{width:>12,}{seconds:>10.3f}")


def gram_vs_loop() -> None:
    before, spans, width = synthetic_clients(40, 200_000, seed=0)
    matrix = torch.stack([torch.cat(p) for p in before])
    layers = [matrix[:, a:b] for ((a, b),) in spans]
    t_gram = best_time(lambda: conflict_scores_in_spans(matrix, spans, 0.0))
    t_loop = best_time(lambda: pairwise_loop_scores(layers, 0.0), repeat=1)
    same = conflict_scores_in_spans(matrix, spans, 0.0).tolist() == pairwise_loop_scores(layers, 0.0)
    print(f"\n40 clients x {width:,} parameters: Gram {t_gram:.4f} s, pairwise loop {t_loop:.3f} s "
          f"({t_loop / t_gram:.0f}x slower), same scores: {same}")


def grouping_scaling() -> None:
    from flcore.lag.groups import MIN_UPLOADS, UpdateProfiles
    print(f"\ngrouping per round, a FedAvgCNN head (5,130 values), every client uploading (best of 3)")
    print(f"{'clients':>8}{'seconds':>10}")
    for clients in (20, 100, 500):
        g = torch.Generator().manual_seed(0)
        profiles = UpdateProfiles(clients, above=0.1)
        for _ in range(MIN_UPLOADS):
            profiles.observe({0: torch.randn(clients, 5130, generator=g)}, range(clients), personal=(0,))
        updates = torch.randn(clients, 5130, generator=g)

        def one_round():
            profiles.observe({0: updates}, range(clients), personal=(0,))
            profiles.groups_of(0)
        print(f"{clients:>8}{best_time(one_round):>10.4f}")


def round_share(data: str = "MNIST", clients: int = 20, groups: bool = False) -> None:
    from app.build import build_server, prepare
    from app.run import FederatedRun
    from app.options import parse_args
    flags = ["-algo", "FedLAG", "-data", data, "-nc", str(clients), "-m", "CNN", "-gr", "2", "-dev", "cpu",
             "--threads", str(torch.get_num_threads()),
             "-go", "bench", "--results_dir", tempfile.mkdtemp()]
    config, _ = prepare(parse_args(flags + (["--lag_share", "groups"] if groups else [])))
    server = build_server(config)
    from flcore.servers.serverbase import Server
    timings = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            out = fn(*a, **kw)
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
            return out
        return wrapper
    # Time the mixin's hooks and, separately, the base hooks they wrap.
    server.send_models = timed("send (with LAG)", server.send_models)
    server.receive_models = timed("receive (with LAG)", server.receive_models)
    server.aggregate_parameters = timed("aggregate (with LAG)", server.aggregate_parameters)
    base = Server.send_models, Server.receive_models, Server.aggregate_parameters
    Server.send_models = timed("send (base)", base[0])
    Server.receive_models = timed("receive (base)", base[1])
    Server.aggregate_parameters = timed("aggregate (base)", base[2])
    try:
        start = time.perf_counter()
        FederatedRun(server).execute()
        total = time.perf_counter() - start
    finally:
        Server.send_models, Server.receive_models, Server.aggregate_parameters = base
    lag = sum(timings[f"{hook} (with LAG)"] - timings[f"{hook} (base)"] for hook in ("send", "receive", "aggregate"))
    rounds = config.global_rounds + 1
    print(f"\nFedLAG{' --lag_share groups' if groups else ''} on {data}/CNN, {clients} clients, {rounds} rounds: "
          f"{total / rounds:.2f} s a round, LAG {lag / rounds:.4f} s a round ({lag / total:.2%} of the run)")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--round-share", action="store_true")
    cli.add_argument("--groups", action="store_true", help="--lag_share groups: its cost and the grouping's scaling")
    cli.add_argument("--data", default="MNIST")
    cli.add_argument("--clients", type=int, default=20)
    cli.add_argument("--threads", type=int, default=1, help="intra-op threads (ratios on a shared machine: 1)")
    opts = cli.parse_args()
    torch.set_num_threads(opts.threads)
    scaling()
    gram_vs_loop()
    if opts.groups:
        grouping_scaling()
    if opts.round_share:
        round_share(opts.data, opts.clients, opts.groups)


if __name__ == "__main__":
    main()
