"""The documentation a newcomer reads: every relative link resolves to a file, and to a heading where it
names one, inside the repository; the README stays a first hour (short, with the test command CI runs)."""
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from helpers import REPO

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "flower" / "README.md",
                    REPO / "results" / "README.md", REPO / "patches" / "README.md"])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens kept), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> Set[str]:
    """Every heading's anchor in a Markdown file (a repeated heading gets -1, -2 ... as on GitHub)."""
    seen: Dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def relative_links(path: Path) -> List[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+:", target)]


def test_the_anchor_of_a_heading_is_githubs():
    assert slug("Parallel clients: Ray") == "parallel-clients-ray"
    assert slug("FedLAG and X+LAG") == "fedlag-and-xlag"
    assert slug("Long runs: checkpoints, resume, divergence") == "long-runs-checkpoints-resume-divergence"
    assert slug("Grids: `run_all.sh` and report.py") == "grids-run_allsh-and-reportpy"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(document):
    broken: List[Tuple[str, str]] = []
    for target in relative_links(document):
        file_part, _, anchor = target.partition("#")
        resolved = (document.parent / file_part).resolve() if file_part else document
        if REPO.resolve() not in (resolved, *resolved.parents):
            broken.append((target, "outside the repository"))
        elif not resolved.exists():
            broken.append((target, "no such file"))
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append((target, f"no heading #{anchor}"))
    assert not broken, f"{document.relative_to(REPO)}: {broken}"


def test_the_readme_is_a_first_hour_with_the_test_command_ci_runs():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "python -m pytest -q" in text and "python -m pytest -q" in (REPO / ".ci" / "run").read_text()
    for section in ("Install", "Quickstart", "Run the tests", "Algorithms", "Datasets"):
        assert f"## {section}\n" in text, section
    assert "../" not in text, "the README names a folder outside the repository"
    assert text.index("download.pytorch.org/whl/cpu") < text.index("pip install -r requirements.txt\n")
