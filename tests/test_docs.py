"""The repository as a product: the README's set-up commands, CI running them, docs that stand alone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The commands of the README's first shell block, comments stripped."""
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_opens_with_the_run_and_test_commands():
    run, test = readme_commands()[:2]
    assert run.endswith("gnnio run --layer gat") and "pip install" in run and " -e " not in run
    assert test.endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command_as_written():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert readme_commands()[1] in ci


def test_docs_stay_small():
    assert len([path for path in (REPO / "docs").rglob("*") if path.is_file()]) < 30


def test_nothing_refers_outside_the_repository():
    pattern = re.compile(r"\.\./shared|shared/datasets|DESIGN\.md|ANCHORS\.md|docs/BENCHMARKS|docs/benchmarks")
    files = [REPO / "README.md", REPO / "pyproject.toml", *(REPO / ".ci").iterdir()]
    for folder in ("gnnio_cli", "native", "tests", "docs", "sample_graphs"):
        files += [path for path in (REPO / folder).rglob("*") if path.suffix in {".py", ".md", ".cu", ".cuh", ".cpp"}]
    offenders = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path in files
        if path.is_file() and path != Path(__file__).resolve()
        for match in pattern.finditer(path.read_text(errors="replace"))
    ]
    assert offenders == []
