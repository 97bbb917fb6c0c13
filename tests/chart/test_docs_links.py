"""Every relative link between the docs pages lands on a page and, with an anchor, on a heading of it (the research
record moved out of docs/evaluation.md into docs/experiments.md, and its anchors with it)."""

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


# What a reader of the repository cannot follow: the team's issue tracker (not linked from the repository), the
# project's seed documents and the reference folder beside the repository.
OUTSIDE = re.compile(
    r"\bissues?[ -]#?\d+|\bthe issue's\b|\bseed 0\d\d\b|\.\./shared/|\bshared/reference/", re.IGNORECASE
)


def test_the_docs_point_only_at_what_the_repository_holds():
    pages = [
        ROOT / "README.md",
        ROOT / "charts" / "rlt-operator" / "README.md",
        *sorted(DOCS.rglob("*.md")),
        *sorted((ROOT / "manifests" / "examples").glob("*.yaml")),
    ]
    found = [
        f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        for m in OUTSIDE.finditer(line)
    ]
    assert found == []


def test_a_figure_quoted_beside_a_spec_field_is_the_fields_own():
    """The data guide quotes the built-in task's row limit next to `spec.dataset.size`: the model's bound is the
    one source (it said 1,000,000 where the spec allows 100,000)."""
    from rlt.spec.inputs import DatasetSpec

    [limit] = [m.le for m in DatasetSpec.model_fields["size"].metadata if hasattr(m, "le")]
    quoted = re.search(
        r"at\s+most\s+([\d,]+)\s+rows\s+\(`spec\.dataset\.size`\)", (DOCS / "data-formats.md").read_text()
    )
    assert quoted is not None and int(quoted.group(1).replace(",", "")) == limit


def test_the_demo_time_has_one_home():
    """README.md's quick start gives the demo's measured time; the example it runs points there instead of
    quoting a second figure that drifts (it said 15 min where the README said 5)."""
    header = [
        line
        for line in (ROOT / "manifests" / "examples" / "rltrun-local.yaml").read_text().splitlines()
        if line.startswith("#")
    ]
    assert not any(re.search(r"\d+\s*min", line) for line in header), header
    assert re.search(r"make demo.*about \d+ min", (ROOT / "README.md").read_text())


def test_the_spec_reference_opens_with_its_field_table():
    """A reader looking a field up finds the table first (it used to come after 200 lines of prose)."""
    page = (DOCS / "spec.md").read_text()
    assert re.findall(r"^## (.+)$", page, re.M)[0] == "Fields"
    assert page.index("<!-- BEGIN SPEC TABLE -->") < 40 * 80  # within the first screenfuls
