"""The whole grid checked before its first run: every problem listed at once, nothing started, and the
dry run saying which runs each problem refuses."""
import pytest

import grid.settings
from grid.checks import check_batch
from grid.cli import main, settings_from_flags
from grid.command_line import parse_command_line
from grid.partitions import partition_problem
from grid.seeds import seed_count, seed_list, seed_spans
from grid.settings import MAX_RUNS, resolve_settings
from grid.usage import UsageError

LARGEST_SEED = 2**32 - 1


def flags_in(tmp_path, *flags):
    """run_all.sh's flags on a small grid whose every folder and file would go under ``tmp_path``."""
    return ["-d", "Digits", "-p", "iid", "-s", "0", "-m", "DNN", "-r", "1", "-c", "8", "--data_dir",
            str(tmp_path / "data"), "--results_dir", str(tmp_path / "results"), *flags]


def refusal(argv, capsys):
    """(exit status, stderr lines, stdout) of ``run_all.sh argv``."""
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


def test_every_problem_of_a_grid_is_listed_at_once_and_nothing_starts(tmp_path, capsys, monkeypatch):
    import subprocess

    def nothing_may_start(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "run", nothing_may_start)
    monkeypatch.setattr(subprocess, "Popen", nothing_may_start)
    grid = tmp_path / "bad.grid"
    grid.write_text("algorithms: FedAvg FedAwg Bogus FedLAG\npartitions: iid-rot0 iid-rot5 iid-cor8 iid\n"
                    "seeds: 0-99999999999\nmodels: DNN CNNN\njoin_ratio: 2\n")
    code, err, _ = refusal(["-g", str(grid), "--results_dir", str(tmp_path / "r"), "--data_dir",
                            str(tmp_path / "d")], capsys)
    assert code == 2
    assert err[0] == "run_all.sh: the grid has 9 problems; nothing was started:"
    problems = [line.strip() for line in err[1:]]
    assert len(problems) == 9 and all(line.startswith("  ") for line in err[1:])
    assert problems[0].startswith("seed 0-99999999999 goes above 4294967295")
    # 4 algorithms x 1 dataset x 4 partitions x 2 models x 10**11 seeds
    assert problems[1].startswith("the grid makes 3,200,000,000,000 runs (4 algorithms x 1 dataset x 4 partitions "
                                  "x 2 models x 100,000,000,000 seeds), more than the 100,000")
    assert problems[2].startswith("unknown algorithm 'FedAwg'; did you mean 'FedAvg'")
    assert problems[3].startswith("unknown algorithm 'Bogus'; choose one of: ")
    assert problems[4].startswith("unknown model 'CNNN'; did you mean 'CNN'?")
    assert problems[5] == ("unknown partition 'iid-rot0' (dir<alpha>, exdir<alpha>, pat<k>, iid or -; then "
                           "optionally -lg<G> and -rot<G> or -cor<G>, G >= 2)")
    assert "'iid-rot5' cannot be built" in problems[6] and "at most 4, got 5" in problems[6]
    assert "'iid-cor8' cannot be built" in problems[7] and "the default list has 7" in problems[7]
    # main.py's own check of the commands, once for all of them
    assert problems[8] == "-jr/--join_ratio must be in (0, 1], got 2.0"
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_a_dry_run_shows_which_runs_are_refused_and_why(tmp_path, capsys):
    code, err, out = refusal(flags_in(tmp_path, "-a", "FedAvg Bogus", "-s", "0 1", "--dry-run"), capsys)
    assert code == 2 and err[0].startswith("run_all.sh: unknown algorithm 'Bogus'") and len(err) == 1
    lines = [line for line in out.splitlines() if not line.startswith("    python")]
    assert len(lines) == 4   # 2 algorithms x 2 seeds
    for line in lines:
        name, action = line.split(maxsplit=1)
        if "_Bogus_" in name:
            assert action.startswith("refused: unknown algorithm 'Bogus'")
        else:
            assert action == "not started: the batch is refused"
    assert not (tmp_path / "results").exists()


def test_main_py_checks_each_command_and_names_the_algorithms_a_problem_concerns(tmp_path):
    grid = tmp_path / "g.grid"
    grid.write_text("algorithms: FedAvg FedProx Ditto\nargs.FedProx: -mu -1\n")
    with pytest.raises(UsageError) as refused:
        settings_from_flags(["-g", str(grid), *flags_in(tmp_path, "--", "-lbs", "4")])
    assert str(refused.value) == "-mu/--mu (FedProx's proximal weight) must be >= 0, got -1.0 (runs of FedProx)"
    grid.write_text("algorithms: FedAvg FedProx Ditto\nargs.FedProx: -mu 0.1\n")   # -mu 0.1 for FedProx only
    assert settings_from_flags(["-g", str(grid), *flags_in(tmp_path)]).algorithms == ["FedAvg", "FedProx", "Ditto"]


def test_a_dataset_the_batch_would_build_needs_its_generator(tmp_path, capsys):
    code, err, _ = refusal(flags_in(tmp_path, "-a", "FedAvg", "-d", "mnist Digits"), capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("run_all.sh: unknown dataset 'mnist'; did you mean 'MNIST'? (no dataset/generate_mnist.py")
    # A folder used as it is (-p -) is main.py's to find, with its data.
    settings = settings_from_flags(flags_in(tmp_path, "-a", "FedAvg", "-d", "My-own-folder", "-p", "-"))
    assert settings.datasets == ["My-own-folder"]


@pytest.mark.parametrize("partition, clients, problem", [
    ("iid-rot4", "8", None), ("dir0.1-lg4-cor7", "8", None), ("iid-cor3+noise+blur+jpeg", "8", None),
    ("iid-rot0", "8", "unknown partition 'iid-rot0'"),   # fewer than two groups is no shift
    ("iid-rot5", "8", "4 distinct quarter turns, so --feature-groups must be at most 4, got 5"),
    ("iid-cor8", "8", "--feature-groups 8 needs 8 corruptions and the default list has 7"),
    ("iid-cor3+noise+blur", "8", "--corruptions names 2 corruptions for --feature-groups 3"),
    ("iid-cor3s9", "8", "--severity must be one of 1, 2, 3, 4, 5, got 9"),
    ("iid-rot4", "3", "--feature-groups must be between 1 and --num-clients (3), got 4"),
    ("pat2-lg9", "8", "--label-groups must be between 1 and --num-clients (8), got 9"),
    ("dir0", "8", "the Dirichlet alpha (--alpha) must be a positive number, got 0"),
    ("pat0", "8", "each client needs at least one class (--class-per-client), got 0"),
])
def test_a_partition_is_checked_as_its_generator_checks_it(partition, clients, problem):
    found = partition_problem(partition, clients)
    assert found == problem if problem is None else problem in found


def test_seed_ranges_are_counted_without_a_list():
    spans, problems = seed_spans("3, 0-4 2 10-12 7-5 x")
    assert spans == [(3, 3), (0, 4), (2, 2), (10, 12)]
    assert problems == ["seed range '7-5' runs backwards (write 5-7)", "seed 'x' is not a number or a range like 0-4"]
    assert seed_count(spans) == 8                      # 0..4 and 10..12
    assert seed_list(spans) == [3, 0, 1, 2, 4, 10, 11, 12]
    assert seed_count(seed_spans("0-99999999999 5")[0]) == 10**11


def test_a_grid_of_millions_of_runs_is_refused_by_its_count_before_a_seed_is_listed(tmp_path, monkeypatch):
    def no_list(spans):
        raise AssertionError("seeds listed")
    monkeypatch.setattr(grid.settings, "seed_list", no_list)
    settings = resolve_settings(parse_command_line(flags_in(tmp_path, "-a", "FedAvg FedLAG", "-s", "0-49999 0-50000")))
    assert settings.seeds == [] and settings.problems == [
        "the grid makes 100,002 runs (2 algorithms x 1 dataset x 1 partition x 1 model x 50,001 seeds), more than "
        "the 100,000 one batch may hold; list fewer seeds (e.g. -s 0-4) or values"]
    assert MAX_RUNS == 100_000


@pytest.mark.parametrize("seeds, problem", [
    (f"{LARGEST_SEED}", None),
    (f"{LARGEST_SEED + 1}", f"seed {LARGEST_SEED + 1} goes above {LARGEST_SEED}, the largest seed a run can use"),
    ("1 " + "1" + "0" * 23, f"seed 1{'0' * 23} goes above {LARGEST_SEED}"),
    (f"{LARGEST_SEED - 1}-{LARGEST_SEED + 1} {10**12}",
     f"seeds {LARGEST_SEED - 1}-{LARGEST_SEED + 1}, {10**12} go above {LARGEST_SEED}"),
])
def test_every_seed_must_seed_its_run(seeds, problem, tmp_path):
    """Grid seed s is main.py's --seed 0 -pv s: the run is seeded with s, which NumPy takes up to 2**32-1."""
    checked = check_batch(resolve_settings(parse_command_line(flags_in(tmp_path, "-a", "FedAvg", "-s", seeds))))
    if problem is None:
        assert checked.problems == [] and checked.plan.runs[0].name.endswith(f"_{LARGEST_SEED}")
    else:
        assert len(checked.problems) == 1 and checked.problems[0].startswith(problem), checked.problems
        assert any(reason.startswith("seed ") for reason in checked.refused.values())
