"""What ``run_all.sh`` accepts (its ``--help`` text) and how a bad command or grid file is refused."""
from __future__ import annotations

from utils.errors import UserError

# Error lines start with the command users type, whichever entry point ran the module.
PROGRAM = "run_all.sh"
# Progress lines have their own, shorter prefix, fixed because logs and tests grep for it.
PROGRESS = "run_all:"

USAGE = """\
usage: run_all.sh [options] [-- extra main.py flags for every run]

Grid (a --grid file sets defaults; these flags override it):
  -g, --grid FILE        grid file (default: benchmarks/grids/quick.grid)
  -a, --algorithms LIST  e.g. "FedAvg FedLAG FedRep+LAG"   (lists: spaces or commas)
  -d, --datasets LIST    generator names: Digits MNIST FashionMNIST EMNIST Cifar10 Cifar100
  -p, --partitions LIST  dir<alpha> exdir<alpha> pat<classes> iid, or - (use folder D as it is),
                         each optionally shifted: -lg<G> (labels), -rot<G> or -cor<G> (images),
                         e.g. iid-lg4 dir0.1-rot4; folder D-P, or D-P-nc<N> when -c N is not 20
  -s, --seeds LIST       e.g. "0 1 2" or 0-4 (0..4294967295: seed s seeds its run with s)
  -m, --models LIST      e.g. "CNN DNN"
  -r, --rounds N         -gr of every run
  -c, --clients N        -nc of every run, and --num-clients of generated datasets
      --jr R             -jr (join ratio)
      --goal NAME        result tag; the run's -go is NAME-<model> (default: the grid's file name)
      --source D=FILE    build dataset D offline from FILE.npz (repeatable; default: download)
      --device DEV       -dev of every run (default: main.py's, cuda falling back to cpu)
Batch:
  -j, --jobs N           runs at once (default 1); each gets OMP_NUM_THREADS = 1 unless set
      --data_dir DIR     dataset folders (default: dataset/)
      --results_dir DIR  .h5 files (default: results/); logs in DIR/logs/
      --timeout SEC      stop a run after SEC seconds (it counts as failed)
      --checkpoint N     checkpoint every N rounds and resume from it (--checkpoint_every N --resume),
                         so an interrupted batch also resumes runs mid-way
      --report           afterwards, system/report.py on this goal's results -> <results_dir>/report/<goal>/
      --dry-run          print the runs and what would happen to each (or what refuses it), run nothing
  -h, --help

Grid file: one "key: values" per line, '#' starts a comment. Keys: algorithms, datasets, partitions,
seeds, models (lists), rounds, clients, join_ratio, goal, device, jobs (one value), source (D=FILE,
repeatable), args (main.py flags for every run), args.<ALGO> (flags for ALGO and ALGO+LAG only).
Relative paths in a grid are relative to the repository root; on the command line, to the current
directory. The whole grid is checked before the first run (names, seeds, partitions, and each run's
main.py flags as main.py checks them); a grid with problems is refused, every problem listed.
"""


class UsageError(UserError, ValueError):
    """A bad flag, grid file or grid value: printed as ``run_all.sh: <message>``, exit status 2."""
