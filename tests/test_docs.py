"""The front door stays true: every relative link in README.md and docs/*.md names a file that
exists, and every ``partita COMMAND`` the README names is a real subcommand (and every real
subcommand is in the README's table of commands)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target): the target up to whitespace or ')'; images too (![alt](target)).
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their 1-based numbers."""
    out, in_fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((n, re.sub(r"`[^`]*`", "", line)))  # inline code is not a link
    return out


def relative_links(page: Path) -> list[tuple[int, str]]:
    links = []
    for n, line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http:, https:, mailto:, and anchors within the page
            links.append((n, target))
    return links


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(page: Path) -> None:
    broken = []
    for n, target in relative_links(page):
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(f"{page.relative_to(ROOT)}:{n}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_pages_have_links() -> None:
    # The link pattern must keep finding the README's links, or the test above checks nothing.
    targets = {t for _, t in relative_links(ROOT / "README.md")}
    assert "docs/overview.md" in targets and "docs/architecture.md" in targets


def subcommands() -> set[str]:
    """The subcommands, read off ``partita --help`` (the parser the command line builds)."""
    from partita.cli import build_parser

    help_text = build_parser().format_help()
    section = help_text.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    # Under the COMMAND line, each subcommand is indented by four spaces, its help after it
    # (or on the next line, more indented, when the name is long).
    return set(re.findall(r"^    ([a-z][a-z_-]*)(?:\s{2,}|$)", section, re.M))


def readme_commands() -> tuple[set[str], set[str]]:
    """The commands of the README's table (first column) and every ``partita WORD`` it names
    where WORD is a command-like word (not an option, a file or a placeholder)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"^\| `([a-z][a-z_-]*)` \|", section, re.M))
    named = set(re.findall(r"(?:^\$ |`)partita ([a-z][a-z_-]*)\b(?![.\w/-]*\.(?:pir|onnx|toml))", text, re.M))
    return table, named


def test_readme_commands_are_real_subcommands() -> None:
    real = subcommands()
    table, named = readme_commands()
    assert table, "the README's table of commands was not found"
    assert table <= real, f"the README lists commands partita does not have: {sorted(table - real)}"
    assert named <= real, f"the README names commands partita does not have: {sorted(named - real)}"
    assert real <= table, f"commands missing from the README's table: {sorted(real - table)}"


def test_readme_states_the_number_of_commands() -> None:
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten",
             11: "eleven", 12: "twelve"}
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"has (\w+) commands", text)
    assert m, "the README no longer says how many commands partita has"
    assert m.group(1) == words.get(len(subcommands()), str(len(subcommands())))
