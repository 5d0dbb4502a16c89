"""Recorded locations: relative to the repository inside it (committed results name no machine)."""
from pathlib import Path

from utils.paths import REPO_ROOT, portable_config, recorded_location


def test_locations_inside_the_repository_are_recorded_relative_and_resolve_back():
    inside = REPO_ROOT / "results" / "benchmarks" / "x"
    config = portable_config({"results_dir": str(inside), "data_dir": None, "goal": str(inside)})
    assert config == {"results_dir": str(Path("results/benchmarks/x")), "data_dir": None, "goal": str(inside)}
    assert recorded_location(config["results_dir"]) == inside


def test_locations_outside_the_repository_are_kept_as_given(tmp_path):
    config = portable_config({"data_dir": str(tmp_path)})
    assert config["data_dir"] == str(tmp_path)
    assert recorded_location(config["data_dir"]) == tmp_path


def test_names_that_would_leave_their_folder_are_refused():
    import pytest
    from utils.paths import check_name
    for good in ("MNIST-dir0.1", "quick-CNN", "a.b"):
        assert check_name(good, "-go") == good
    for bad, reason in (("../x", "path separator"), ("a\\b", "path separator"), ("..", "'..'"), ("", "empty")):
        with pytest.raises(ValueError, match=reason):
            check_name(bad, "-go")
