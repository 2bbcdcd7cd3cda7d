"""bench/report_sections.py: each benchmark's section of bench/RESULTS.md, and the command
line it shows for rerunning it."""

from __future__ import annotations

from pathlib import Path

from bench import report_sections

BEGIN = "<!-- x:begin -->"
END = "<!-- x:end -->"


def test_the_shown_command_leaves_out_this_runs_scratch_paths() -> None:
    shown = report_sections.shown_command(
        "bench/x.py",
        ["--epochs=3", "--json", "/tmp/x.json", "--data-dir=/tmp/d", "--keep"],
        ("--json", "--data-dir"),
    )
    assert shown == "python bench/x.py --epochs=3 --keep"


def test_the_section_replaces_its_previous_version_and_keeps_the_rest(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# head\n", encoding="utf-8")
    report_sections.write_section(results, f"{BEGIN}\nold\n{END}", BEGIN, END)
    results.write_text(results.read_text() + "\n## after\n", encoding="utf-8")
    report_sections.write_section(results, f"{BEGIN}\nnew\n{END}", BEGIN, END)
    text = results.read_text()
    assert text == f"# head\n\n{BEGIN}\nnew\n{END}\n\n## after\n"
