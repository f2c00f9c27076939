"""The README stays a front page (read in five minutes), and every relative link in it and in docs/
leads somewhere: the file exists and, for a link into a markdown file, so does the heading anchor."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code (links there are examples, not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """GitHub's heading anchor: markup dropped, lower case, punctuation but - and _ removed, spaces -> -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_github_slug_matches_githubs_rules():
    # constructed headings, with the anchors GitHub gives them
    assert github_slug("`cachemon check` --kv-events") == "cachemon-check---kv-events"
    assert github_slug("Cause `cold_cache`") == "cause-cold_cache"
    assert github_slug("Prometheus, alerts, Grafana, deploy") == "prometheus-alerts-grafana-deploy"
    assert github_slug("Attribution v2 replayed on the KV-event captures") == \
        "attribution-v2-replayed-on-the-kv-event-captures"


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move sections to docs/"


def test_readme_quick_start_lists_the_two_commands_it_promises():
    text = README.read_text(encoding="utf-8")
    quick = text[text.index("## Quick start"):]
    block = quick[quick.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert "Two commands" in quick and commands == ["make demo", "make test"]


def _links():
    for page in PAGES:
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target):   # http:, https:, mailto:
                continue
            yield pytest.param(page, target, id=f"{page.relative_to(ROOT)}->{target}")


@pytest.mark.parametrize(("page", "target"), list(_links()))
def test_relative_link_resolves(page, target):
    file_part, _, anchor = target.partition("#")
    dest = (page.parent / file_part).resolve() if file_part else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: {target}: no such file"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_every_docs_page_is_reachable_from_the_docs_index():
    index = _prose((ROOT / "docs" / "README.md").read_text(encoding="utf-8"))
    linked = {(ROOT / "docs" / t.partition("#")[0]).resolve() for t in LINK.findall(index)}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"
