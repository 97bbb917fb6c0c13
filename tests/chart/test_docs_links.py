"""Every relative link between the docs pages lands on a page and, with an anchor, on a heading of it (issue 45:
the research record moved out of docs/evaluation.md into docs/experiments.md, and its anchors with it)."""

import re

from suite_helpers import ROOT

DOCS = ROOT / "docs"
LINK = re.compile(r"\]\((?!https?:)([^)#\s]*\.md)?(?:#([^)\s]+))?\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def test_links_between_docs_pages_resolve_with_their_anchors():
    broken = []
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for target, anchor in LINK.findall(page.read_text()):
            if not target and not anchor:
                continue
            dest = (page.parent / target).resolve() if target else page
            if not dest.is_file():
                broken.append(f"{page.name}: {target} missing")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target}#{anchor} names no heading")
    assert broken == []


def test_evaluation_is_the_user_guide_and_experiments_the_record():
    guide, record = (DOCS / "evaluation.md").read_text(), (DOCS / "experiments.md").read_text()
    assert "## Stage `evaluate`" in guide and "## `rlt compare FILE.yaml`" in guide
    assert "pre-registered" not in guide.split("## Experiments", 1)[0]  # no research log in the guide
    assert "(experiments.md)" in guide and "(evaluation.md)" in record
    assert "### Protocol (fixed before any result)" in record
