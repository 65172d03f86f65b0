"""The README and the pages under docs/ hold together: every relative link reaches a file, every
`#anchor` a heading of that page (GitHub's slugs), and every file under docs/ is linked from the
README or another page, so that no page is written that nobody can find."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(path: Path) -> list[str]:
    """The page's lines outside code fences (a `# comment` in a shell block is no heading)."""
    out, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path):
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose(path) for m in LINK.finditer(line)
            if not m.group(1).startswith(("http://", "https://", "mailto:"))]


def test_slugs_follow_github():
    assert slug("When a backend fails: failover, passive health, fallbacks") == \
        "when-a-backend-fails-failover-passive-health-fallbacks"
    assert slug("OpenAI Responses (Codex CLI, Agents SDK)") == "openai-responses-codex-cli-agents-sdk"
    assert slug("Traces (OpenTelemetry)") == "traces-opentelemetry"
    assert slug("`make test` and `JOBS`") == "make-test-and-jobs"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def test_every_file_under_docs_is_linked_from_somewhere():
    linked = set()
    for page in pages():
        for target in links(page):
            path = target.partition("#")[0]
            if path:
                linked.add((page.parent / path).resolve())
    orphans = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*"))
               if p.is_file() and p.resolve() not in linked]
    assert not orphans, f"pages under docs/ that nothing links to (add them to the README's Read on): {orphans}"


def test_the_readme_stays_a_newcomers_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move a topic to a page under docs/"
    top = "\n".join(lines[:8])
    assert "make demo" in top and "make test" in top  # the two commands come first


def test_the_package_metadata_names_the_dialects_the_readme_lists():
    import tomllib

    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    dialects = re.findall(r"^- \*\*(.+?)\*\*:", readme, flags=re.M)
    assert len(dialects) == 5, dialects
    assert "five client dialects" in readme and "five client dialects" in description
    for name in dialects:
        assert name.replace("Google ", "") in description.replace("Google ", ""), (name, description)
