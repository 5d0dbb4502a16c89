"""Server-side cost of FedLAG's conflict analysis: scaling, Gram vs pairwise loop, share of a round.

    python benchmarks/lag_cost.py                 # scaling + Gram vs loop (synthetic updates)
    python benchmarks/lag_cost.py --round-share   # also a real round on MNIST/CNN (needs dataset/MNIST)

1. Scaling: m clients and a model of P parameters split into layers the shape of FedAvgCNN's; the time
   of what the mixin runs every round (starting rows, in-place updates, one Gram matrix per layer on
   column views). The issue's bar: 100 clients x 1M parameters well under a second on this CPU.
2. Gram matrix vs a Python loop over client pairs (the authors' ``pair_cos``), same inputs, as a ratio.
3. With ``--round-share``: a FedLAG run on MNIST (20 clients, CNN, batch 10, 8 rounds) with each part
   of LAG's server work timed (holding the starts and writing the updates, scoring, grouping, sharing
   within groups), medians over the rounds as fractions of the median round. ``--groups`` runs it with
   ``--lag_share groups`` (scoring, profiles, grouping and the averages within groups), and ``--data`` /
   ``--clients`` another split, e.g.
   ``--data Digits-iid-lg4 --clients 40 --groups`` (the embedded concept shift, where a round is shortest);
   ``--check`` runs ``--lag_share check`` and times the selected clients' checks (three evaluations of
   their held-out data per personal layer: client work the server's simulation runs, not the server's).
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


def round_share(data: str = "MNIST", clients: int = 20, groups: bool = False, rounds: int = 8,
                check: bool = False) -> None:
    """A real FedLAG run (every client uploading every round), each part of LAG's server work timed in
    every round; medians over the rounds, against the median round (``rs_round_time``: selection to the
    end of aggregation, evaluation included)."""
    import statistics

    import flcore.lag.checked_copies as checked_copies
    import flcore.lag.mixin as mixin
    import flcore.lag.sharing as sharing
    import flcore.lag.updates as updates
    from app.build import build_server, prepare
    from app.run import FederatedRun
    from app.options import parse_args
    from flcore.servers.serverbase import Server
    flags = ["-algo", "FedLAG", "-data", data, "-nc", str(clients), "-m", "CNN", "-gr", str(rounds - 1),
             "-dev", "cpu", "--threads", str(torch.get_num_threads()),
             "-go", "bench", "--results_dir", tempfile.mkdtemp()]
    share = (["--lag_share", "check", "--val_ratio", "0.1"] if check else
             ["--lag_share", "groups"] if groups else [])
    config, _ = prepare(parse_args(flags + share))
    server = build_server(config)
    calls: dict = {}
    # (owner, function, what it is timed as): the mixin's broadcast less the base broadcast inside it is
    # holding every client's start; with writing each update, that is the delta signal's own work.
    timed = [(mixin.LayerConflictMixin, "send_models", "send"), (Server, "send_models", "base send"),
             (updates.UpdateMatrix, "collect", "write updates"),
             (updates, "layer_evidence_in_spans", "scoring"), (sharing.GroupSharing, "regroup", "grouping"),
             (sharing.GroupSharing, "share", "sharing"), (checked_copies.CheckedCopies, "check", "check")]
    originals = [getattr(owner, name) for owner, name, _ in timed]

    def timing(original, part):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            out = original(*a, **kw)
            calls.setdefault(part, []).append(time.perf_counter() - start)
            return out
        return wrapper
    for (owner, name, part), original in zip(timed, originals):
        setattr(owner, name, timing(original, part))
    try:
        FederatedRun(server).execute()
    finally:
        for (owner, name, _), original in zip(timed, originals):
            setattr(owner, name, original)
    # The mixin's send runs the clients' checks (--lag_share check) before the base broadcast: not holding starts.
    checks = calls.get("check", [])
    start_held = [a - b - (checks[i] if i < len(checks) else 0.0)
                  for i, (a, b) in enumerate(zip(calls.pop("send"), calls.pop("base send")))]
    parts = {"updates": [a + b for a, b in zip(start_held, calls.pop("write updates"))], **calls}
    round_time = statistics.median(server.history["rs_round_time"])
    print(f"\nFedLAG{' ' + ' '.join(share) if share else ''} on {data}/CNN, {clients} clients, {rounds} rounds "
          f"(medians over the rounds): a round {round_time:.2f} s")
    medians = {part: statistics.median(values) for part, values in parts.items()}
    for part, value in medians.items():
        print(f"  {part:<10}{value * 1000:8.1f} ms  {value / round_time:7.2%} of a round")
    own = medians["scoring"] + medians.get("grouping", 0.0)  # the bar: these two, ≤ 1% of a round
    print(f"  scoring and grouping {own / round_time:.2%} of a round; all of LAG "
          f"{sum(medians.values()) / round_time:.2%}")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--round-share", action="store_true")
    cli.add_argument("--groups", action="store_true", help="--lag_share groups: its cost and the grouping's scaling")
    cli.add_argument("--check", action="store_true", help=(
        "with --round-share: --lag_share check --val_ratio 0.1, the clients' checks timed as a part"))
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
        round_share(opts.data, opts.clients, opts.groups, check=opts.check)


if __name__ == "__main__":
    main()
