#!/usr/bin/env bash
# run_all.sh: run a grid of algorithms x datasets x partitions x models x seeds through system/main.py.
#
#   ./run_all.sh                                   # the quick grid (benchmarks/grids/quick.grid), Digits
#   ./run_all.sh -g benchmarks/grids/quick.grid -j 2 --report
#   ./run_all.sh -a "FedAvg FedLAG FedRep FedRep+LAG" -d MNIST -p "dir0.1 dir1.0" -s 0-2 -r 50 \
#                --source MNIST=../shared/data/mnist-70k.npz -- -lbs 16
#
# Each (dataset D, partition P) is a dataset folder D-P (e.g. MNIST-dir0.1) under --data_dir for the
# default 20 clients, D-P-nc<N> (MNIST-dir0.1-nc10) for -c N otherwise, built with dataset/generate_D.py
# when missing (offline from --source D=FILE where given); the generator refuses to overwrite a folder
# that holds another split. Partition "-" uses folder D as it is. Duplicate grid entries run once. Seed s of a run is main.py's run index s (-pv s -t s+1, --seed 0), so its
# file is <results_dir>/<D-P>_<algo>_<goal>-<model>_<s>.h5 and it is seeded with s. A run whose
# .h5 is complete and was made with the same flags is skipped, so an interrupted batch resumes.
# One log per run in <results_dir>/logs/. Exit status: 0 all runs done or skipped, 1 some run
# failed (the others still ran), 2 bad usage. ./run_all.sh --help prints the flags.
set -uo pipefail
set -f  # no file-name globbing: grid values are words, never patterns

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-$(command -v python || command -v python3)}"
DEFAULT_GRID="$REPO/benchmarks/grids/quick.grid"

usage() {
    cat <<'EOF'
usage: run_all.sh [options] [-- extra main.py flags for every run]

Grid (a --grid file sets defaults; these flags override it):
  -g, --grid FILE        grid file (default: benchmarks/grids/quick.grid)
  -a, --algorithms LIST  e.g. "FedAvg FedLAG FedRep+LAG"   (lists: spaces or commas)
  -d, --datasets LIST    generator names: Digits MNIST FashionMNIST EMNIST Cifar10 Cifar100
  -p, --partitions LIST  dir<alpha> exdir<alpha> pat<classes> iid, or - (use folder D as it is);
                         folder D-P, or D-P-nc<N> when -c N is not 20
  -s, --seeds LIST       e.g. "0 1 2" or 0-4
  -m, --models LIST      e.g. "CNN DNN"
  -r, --rounds N         -gr of every run
  -c, --clients N        -nc of every run, and --num-clients of generated datasets
      --jr R             -jr (join ratio)
      --goal NAME        result tag; the run's -go is NAME-<model> (default: the grid's file name)
      --source D=FILE    build dataset D offline from FILE.npz (repeatable; default: download)
      --device DEV       -dev of every run (default: main.py's, cuda falling back to cpu)
Batch:
  -j, --jobs N           runs at once (default 1); each gets OMP_NUM_THREADS = cores / N unless set
      --data_dir DIR     dataset folders (default: dataset/)
      --results_dir DIR  .h5 files (default: results/); logs in DIR/logs/
      --timeout SEC      stop a run after SEC seconds (it counts as failed)
      --checkpoint N     checkpoint every N rounds and resume from it (--checkpoint_every N --resume),
                         so an interrupted batch also resumes runs mid-way
      --report           afterwards, system/report.py on this goal's results -> <results_dir>/report/<goal>/
      --dry-run          print the runs and what would happen to each, run nothing
  -h, --help

Grid file: one "key: values" per line, '#' starts a comment. Keys: algorithms, datasets, partitions,
seeds, models (lists), rounds, clients, join_ratio, goal, device, jobs (one value), source (D=FILE,
repeatable), args (main.py flags for every run), args.<ALGO> (flags for ALGO and ALGO+LAG only).
Relative paths in a grid are relative to the repository root; on the command line, to the current
directory.
EOF
}

die() { echo "run_all.sh: $*" >&2; exit 2; }

# ----- settings: built-in defaults < grid file < flags -------------------------------------------------
declare -A SET=()        # values from flags
declare -A GRID=()       # values from the grid file
declare -A ALGO_ARGS=()  # args.<ALGO> lines
GRID_ARGS=()
SOURCES=()               # D=FILE, absolute paths
CLI_EXTRA=()
GRID_FILE=""
JOBS=""
DATA_DIR="$REPO/dataset"
RESULTS_DIR="$REPO/results"
TIMEOUT=""
CHECKPOINT=""
DO_REPORT=0
DRY_RUN=0

abspath() {  # $1 path, $2 base folder for relative paths
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$2/$1" ;;
    esac
}

need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        -g|--grid) need_value "$@"; GRID_FILE="$(abspath "$2" "$PWD")"; shift 2 ;;
        -a|--algorithms) need_value "$@"; SET[algorithms]="$2"; shift 2 ;;
        -d|--datasets) need_value "$@"; SET[datasets]="$2"; shift 2 ;;
        -p|--partitions) need_value "$@"; SET[partitions]="$2"; shift 2 ;;
        -s|--seeds) need_value "$@"; SET[seeds]="$2"; shift 2 ;;
        -m|--models) need_value "$@"; SET[models]="$2"; shift 2 ;;
        -r|--rounds) need_value "$@"; SET[rounds]="$2"; shift 2 ;;
        -c|--clients) need_value "$@"; SET[clients]="$2"; shift 2 ;;
        --jr|--join_ratio) need_value "$@"; SET[join_ratio]="$2"; shift 2 ;;
        --goal) need_value "$@"; SET[goal]="$2"; shift 2 ;;
        --device) need_value "$@"; SET[device]="$2"; shift 2 ;;
        --source) need_value "$@"
            [[ "$2" == *=* ]] || die "--source expects DATASET=FILE, got '$2'"
            SOURCES+=("${2%%=*}=$(abspath "${2#*=}" "$PWD")"); shift 2 ;;
        -j|--jobs) need_value "$@"; JOBS="$2"; shift 2 ;;
        --data_dir) need_value "$@"; DATA_DIR="$(abspath "$2" "$PWD")"; shift 2 ;;
        --results_dir) need_value "$@"; RESULTS_DIR="$(abspath "$2" "$PWD")"; shift 2 ;;
        --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
        --checkpoint) need_value "$@"; CHECKPOINT="$2"; shift 2 ;;
        --report) DO_REPORT=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; CLI_EXTRA=("$@"); break ;;
        *) die "unknown option '$1' (flags for main.py go after --; see --help)" ;;
    esac
done

if [[ -z "$GRID_FILE" && -f "$DEFAULT_GRID" ]]; then
    GRID_FILE="$DEFAULT_GRID"
fi
if [[ -n "$GRID_FILE" ]]; then
    [[ -f "$GRID_FILE" ]] || die "grid file $GRID_FILE not found"
    lineno=0
    while IFS= read -r line || [[ -n "$line" ]]; do
        lineno=$((lineno + 1))
        line="${line%%#*}"
        [[ "$line" =~ ^[[:space:]]*$ ]] && continue
        if [[ ! "$line" =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*(\.[^[:space:]:]+)?)[[:space:]]*:(.*)$ ]]; then
            die "$GRID_FILE:$lineno: expected 'key: values', got '$line'"
        fi
        key="${BASH_REMATCH[1]}"
        value="${BASH_REMATCH[3]}"
        value="${value#"${value%%[![:space:]]*}"}"   # trim leading and trailing blanks
        value="${value%"${value##*[![:space:]]}"}"
        case "$key" in
            algorithms|datasets|partitions|seeds|models|rounds|clients|join_ratio|goal|device|jobs)
                GRID[$key]="$value" ;;
            source)
                [[ "$value" == *=* ]] || die "$GRID_FILE:$lineno: source expects DATASET=FILE"
                SOURCES+=("${value%%=*}=$(abspath "${value#*=}" "$REPO")") ;;
            args) read -r -a words <<<"$value"; GRID_ARGS+=("${words[@]}") ;;
            args.*) ALGO_ARGS[${key#args.}]="${ALGO_ARGS[${key#args.}]:-} $value" ;;
            *) die "$GRID_FILE:$lineno: unknown key '$key' (see --help)" ;;
        esac
    done <"$GRID_FILE"
fi

setting() {  # flag value, else grid value, else the built-in default $2
    if [[ -n "${SET[$1]:-}" ]]; then echo "${SET[$1]}"
    elif [[ -n "${GRID[$1]:-}" ]]; then echo "${GRID[$1]}"
    else echo "$2"; fi
}
as_list() { echo "${1//,/ }"; }

ALGORITHMS=($(as_list "$(setting algorithms "FedAvg FedLAG")"))
DATASETS=($(as_list "$(setting datasets Digits)"))
PARTITIONS=($(as_list "$(setting partitions "dir0.1")"))
MODELS=($(as_list "$(setting models CNN)"))
ROUNDS="$(setting rounds 20)"
CLIENTS="$(setting clients 20)"
JOIN_RATIO="$(setting join_ratio 1.0)"
DEVICE="$(setting device "")"
GRID_NAME="$(basename "${GRID_FILE:-batch}")"
GOAL="$(setting goal "${GRID_NAME%.*}")"
JOBS="${JOBS:-$(setting jobs 1)}"

SEEDS=()
for token in $(as_list "$(setting seeds 0)"); do
    if [[ "$token" =~ ^([0-9]+)-([0-9]+)$ ]]; then
        for ((s = 10#${BASH_REMATCH[1]}; s <= 10#${BASH_REMATCH[2]}; s++)); do SEEDS+=("$s"); done
    elif [[ "$token" =~ ^[0-9]+$ ]]; then
        SEEDS+=("$((10#$token))")   # 007 and 7 are one seed
    else
        die "seed '$token' is not a number or a range like 0-4"
    fi
done

unique() {  # the arguments, each once, in the order of first appearance
    local -A seen=()
    local word
    for word in "$@"; do
        [[ -n "${seen[$word]+x}" ]] || { seen[$word]=1; printf '%s\n' "$word"; }
    done
}
# A value listed twice (or a seed in two ranges) would run the same run twice, concurrently with -j.
for list in ALGORITHMS DATASETS PARTITIONS MODELS SEEDS; do
    declare -n ref="$list"
    mapfile -t ref < <(unique "${ref[@]}")
    unset -n ref
done

[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "-j/--jobs must be a positive integer, got '$JOBS'"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] || die "rounds must be a non-negative integer, got '$ROUNDS'"
[[ "$CLIENTS" =~ ^[1-9][0-9]*$ ]] || die "clients must be a positive integer, got '$CLIENTS'"
[[ -z "$TIMEOUT" || "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a whole number of seconds"
[[ -z "$CHECKPOINT" || "$CHECKPOINT" =~ ^[1-9][0-9]*$ ]] || die "--checkpoint must be a positive number of rounds"
[[ "$GOAL" != *_* && "$GOAL" != */* ]] || die "goal '$GOAL' may not contain '_' or '/' (it is part of file names)"
for list in ALGORITHMS DATASETS PARTITIONS MODELS SEEDS; do
    declare -n ref="$list"
    [[ ${#ref[@]} -gt 0 ]] || die "the grid has no ${list,,}"
    unset -n ref
done

source_of() {  # dataset name -> FILE or empty
    local entry
    for entry in "${SOURCES[@]}"; do
        [[ "${entry%%=*}" == "$1" ]] && { echo "${entry#*=}"; return; }
    done
}

# generator positional arguments and options for a partition token
partition_args() {
    case "$1" in
        iid) echo "iid - -" ;;
        dir*) [[ "${1#dir}" =~ ^[0-9]*\.?[0-9]+$ ]] || return 1; echo "noniid - dir --alpha ${1#dir}" ;;
        exdir*) [[ "${1#exdir}" =~ ^[0-9]*\.?[0-9]+$ ]] || return 1; echo "noniid - exdir --alpha ${1#exdir}" ;;
        pat*) [[ "${1#pat}" =~ ^[0-9]+$ ]] || return 1; echo "noniid - pat --class-per-client ${1#pat}" ;;
        *) return 1 ;;
    esac
}
for p in "${PARTITIONS[@]}"; do
    [[ "$p" == "-" ]] || partition_args "$p" >/dev/null \
        || die "unknown partition '$p' (dir<alpha>, exdir<alpha>, pat<k>, iid or -)"
done

# ----- the plan: one line per run ----------------------------------------------------------------------
LOGS="$RESULTS_DIR/logs"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/run_all.XXXXXX")"
trap 'rm -rf "$STATE"' EXIT
mkdir -p "$STATE/args"

# The folder of dataset D with partition P: every partition parameter run_all varies is in its name.
# The default client count keeps the name earlier batches used (D-P); any other gets -nc<N>. A D-P
# folder from an old batch with another count is not reused: the generator refuses to overwrite a
# different split, and main.py checks the files against config.json.
DEFAULT_CLIENTS=20
folder_name() {  # dataset partition
    if [[ "$2" == "-" ]]; then echo "$1"
    elif [[ "$CLIENTS" == "$DEFAULT_CLIENTS" ]]; then echo "$1-$2"
    else echo "$1-$2-nc$CLIENTS"; fi
}

RUN_NAME=(); RUN_DATA=()
DATA_NAMES=(); declare -A DATA_GEN=()
declare -A PLANNED=()
for seed in "${SEEDS[@]}"; do
    for dataset in "${DATASETS[@]}"; do
        for partition in "${PARTITIONS[@]}"; do
            data="$(folder_name "$dataset" "$partition")"
            if [[ -z "${DATA_GEN[$data]+x}" ]]; then
                DATA_NAMES+=("$data")
                if [[ "$partition" == "-" ]]; then DATA_GEN[$data]=""; else DATA_GEN[$data]="$dataset $partition"; fi
            fi
            for model in "${MODELS[@]}"; do
                for algo in "${ALGORITHMS[@]}"; do
                    goal="$GOAL-$model"
                    # One result file, one run: never start the same run twice.
                    [[ -n "${PLANNED[${data}_${algo}_${goal}_${seed}]+x}" ]] && continue
                    PLANNED[${data}_${algo}_${goal}_${seed}]=1
                    i=${#RUN_NAME[@]}
                    RUN_NAME+=("${data}_${algo}_${goal}_${seed}")
                    RUN_DATA+=("$data")
                    base="${algo%+LAG}"
                    extra=(${ALGO_ARGS[$base]:-})
                    [[ "$base" != "$algo" ]] && extra+=(${ALGO_ARGS[$algo]:-})
                    args=(-algo "$algo" -data "$data" -m "$model" -gr "$ROUNDS" -nc "$CLIENTS" -jr "$JOIN_RATIO"
                          -go "$goal" --seed 0 -pv "$seed" -t "$((seed + 1))"
                          --data_dir "$DATA_DIR" --results_dir "$RESULTS_DIR")
                    [[ -n "$DEVICE" ]] && args+=(-dev "$DEVICE")
                    [[ -n "$CHECKPOINT" ]] && args+=(--checkpoint_every "$CHECKPOINT" --resume)
                    args+=("${GRID_ARGS[@]}" "${extra[@]}" "${CLI_EXTRA[@]}")
                    printf '%s\n' "${args[@]}" >"$STATE/args/$i"
                    printf '%s\t%s\n' "$RESULTS_DIR/${RUN_NAME[i]}.h5" "$STATE/args/$i" >>"$STATE/plan"
                done
            done
        done
    done
done
TOTAL=${#RUN_NAME[@]}

# What to do with each run: complete (skip) / missing / incomplete / stale (rerun).
mapfile -t STATUS < <(cd "$REPO" && "$PY" - "$STATE/plan" <<'PYEOF'
import sys
sys.path[:0] = ["system", "."]
from utils.run_identity import run_status
for line in open(sys.argv[1]):
    path, args_file = line.rstrip("\n").split("\t")
    print(run_status(path, open(args_file).read().splitlines()))
PYEOF
)
[[ ${#STATUS[@]} -eq $TOTAL ]] || die "could not read the state of existing results (is $PY the project's Python?)"

echo "run_all: $TOTAL runs = ${#ALGORITHMS[@]} algorithms x ${#DATA_NAMES[@]} dataset folders x" \
     "${#MODELS[@]} models x ${#SEEDS[@]} seeds | ${ROUNDS} rounds, ${CLIENTS} clients, jr ${JOIN_RATIO} |" \
     "goal ${GOAL} | ${JOBS} at once"
echo "run_all: datasets in $DATA_DIR, results in $RESULTS_DIR, logs in $LOGS"
if [[ $DRY_RUN -eq 1 ]]; then
    for ((i = 0; i < TOTAL; i++)); do
        case "${STATUS[i]}" in
            complete) what="skip (complete)" ;;
            stale) what="run (existing file made with other flags)" ;;
            incomplete) what="run (existing file incomplete)" ;;
            *) what="run" ;;
        esac
        mapfile -t a <"$STATE/args/$i"
        printf '%-60s %s\n    python system/main.py %s\n' "${RUN_NAME[i]}" "$what" "${a[*]}"
    done
    exit 0
fi
mkdir -p "$LOGS" "$RESULTS_DIR" "$DATA_DIR" || die "cannot create $LOGS"

# ----- datasets: build the ones pending runs need ------------------------------------------------------
declare -A DATA_FAILED=()
for data in "${DATA_NAMES[@]}"; do
    gen="${DATA_GEN[$data]}"
    [[ -z "$gen" ]] && continue
    needed=0
    for ((i = 0; i < TOTAL; i++)); do
        [[ "${RUN_DATA[i]}" == "$data" && "${STATUS[i]}" != complete ]] && { needed=1; break; }
    done
    [[ $needed -eq 1 ]] || continue
    read -r dataset partition <<<"$gen"
    log="$LOGS/generate_$data.log"
    script="$REPO/dataset/generate_$dataset.py"
    read -r -a pargs <<<"$(partition_args "$partition")"
    src="$(source_of "$dataset")"
    cmd=("$PY" "$script" "${pargs[@]}" --num-clients "$CLIENTS" --name "$data" --root "$DATA_DIR")
    [[ -n "$src" ]] && cmd+=(--source "$src")
    if [[ ! -f "$script" ]]; then
        echo "no generator dataset/generate_$dataset.py for dataset '$dataset'" >"$log"
        DATA_FAILED[$data]="$log"
        echo "run_all: dataset $data: no generator dataset/generate_$dataset.py (log $log)"
        continue
    fi
    echo "# ${cmd[*]}" >"$log"
    if "${cmd[@]}" >>"$log" 2>&1; then
        echo "run_all: dataset $data: $(tail -n 1 "$log")"
    else
        DATA_FAILED[$data]="$log"
        echo "run_all: dataset $data FAILED: $(tail -n 1 "$log") (log $log)"
    fi
done

# ----- runs ----------------------------------------------------------------------------------------------
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    cores="$(nproc 2>/dev/null || echo 1)"
    threads=$((cores / JOBS))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi

run_one() {  # index; writes its exit status to $STATE/rc.<index>
    local i=$1 name="${RUN_NAME[$1]}" log="$LOGS/${RUN_NAME[$1]}.log" start=$SECONDS rc child
    local -a args cmd
    mapfile -t args <"$STATE/args/$i"
    cmd=("$PY" "$REPO/system/main.py" "${args[@]}")
    [[ -n "$TIMEOUT" ]] && cmd=(timeout "$TIMEOUT" "${cmd[@]}")
    echo "# $(date '+%F %T') run_all.sh: ${cmd[*]}" >"$log"
    "${cmd[@]}" >>"$log" 2>&1 &
    child=$!
    trap 'kill "$child" 2>/dev/null' TERM INT
    wait "$child"; rc=$?
    if [[ $rc -gt 128 ]] && kill -0 "$child" 2>/dev/null; then wait "$child"; rc=$?; fi
    echo "$rc" >"$STATE/rc.$i"
    if [[ $rc -eq 0 ]]; then
        echo "run_all: done   $name ($((SECONDS - start)) s)"
    elif [[ $rc -eq 143 ]]; then
        echo "run_all: stopped $name ($((SECONDS - start)) s)"
    else
        echo "run_all: FAILED $name (exit $rc, $((SECONDS - start)) s, log $log)"
    fi
}

interrupted=0
on_interrupt() {
    interrupted=1
    echo "run_all: interrupted; stopping the running jobs" >&2
    local pid
    for pid in $(jobs -p); do kill -TERM "$pid" 2>/dev/null; done
}
trap on_interrupt INT TERM

declare -a OUTCOME=()
skipped=0
for ((i = 0; i < TOTAL; i++)); do
    [[ $interrupted -eq 1 ]] && break
    if [[ "${STATUS[i]}" == complete ]]; then
        OUTCOME[i]=skipped; skipped=$((skipped + 1)); continue
    fi
    if [[ -n "${DATA_FAILED[${RUN_DATA[i]}]:-}" ]]; then
        OUTCOME[i]=failed
        cp "${DATA_FAILED[${RUN_DATA[i]}]}" "$LOGS/${RUN_NAME[i]}.log" 2>/dev/null
        continue
    fi
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
    [[ $interrupted -eq 1 ]] && break
    note=""; [[ "${STATUS[i]}" != missing ]] && note=" (existing file ${STATUS[i]}: rerun)"
    echo "run_all: start  ${RUN_NAME[i]}$note"
    OUTCOME[i]=started
    run_one "$i" &
done
while [[ $(jobs -rp | wc -l) -gt 0 ]]; do wait; done

# ----- summary ------------------------------------------------------------------------------------------
done_count=0; failed=(); not_run=0; stopped=0
for ((i = 0; i < TOTAL; i++)); do
    case "${OUTCOME[i]:-}" in
        skipped) ;;
        started)
            rc="$(cat "$STATE/rc.$i" 2>/dev/null || echo 143)"
            if [[ "$rc" == 0 ]]; then done_count=$((done_count + 1))
            elif [[ $interrupted -eq 1 && "$rc" == 143 ]]; then stopped=$((stopped + 1))
            else failed+=("$i:$rc"); fi ;;
        failed) failed+=("$i:dataset") ;;
        *) not_run=$((not_run + 1)) ;;
    esac
done
echo
summary="run_all: $TOTAL runs: $done_count done, $skipped skipped (complete), ${#failed[@]} failed"
[[ $interrupted -eq 1 ]] && summary+=", $stopped stopped and $not_run not started (interrupted: run again to continue)"
echo "$summary"
for entry in "${failed[@]}"; do
    i="${entry%%:*}"; rc="${entry#*:}"
    log="$LOGS/${RUN_NAME[i]}.log"
    reason="$(grep -v '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 1 | cut -c1-200)"
    [[ "$rc" == dataset ]] && rc="dataset ${RUN_DATA[i]} not built"
    [[ "$rc" == 124 ]] && rc="timed out after ${TIMEOUT} s"
    echo "  FAILED ${RUN_NAME[i]} (exit $rc): $reason"
    echo "         log: $log"
done

if [[ $DO_REPORT -eq 1 && $((done_count + skipped)) -gt 0 ]]; then
    goals=()
    for model in "${MODELS[@]}"; do goals+=(--goal "$GOAL-$model"); done
    echo
    "$PY" "$REPO/system/report.py" "$RESULTS_DIR" -o "$RESULTS_DIR/report/$GOAL" "${goals[@]}" \
        || echo "run_all: the report failed" >&2
fi

[[ $interrupted -eq 1 ]] && exit 130
[[ ${#failed[@]} -eq 0 ]] || exit 1
exit 0
