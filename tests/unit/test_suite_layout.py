"""The suite's folders are not packages (rootdir-relative imports): two test files with one name in two folders
stop pytest at collection ("import file mismatch"), so the whole run collects nothing."""

from collections import Counter

from suite_helpers import ROOT


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
