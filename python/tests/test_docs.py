"""Every ```python example of the README and of docs/python.md runs as written, a page's
examples one after the other, in a fresh working folder with the repository's data/."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

PAGES = ["README.md", "docs/python.md"]


def examples(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    # batchinfer's own: the README's scikit-learn export is another library's.
    return [b for b in blocks if "batchinfer" in b or "con." in b]


@pytest.mark.parametrize("page", PAGES)
def test_every_python_example_runs(page, tmp_path, monkeypatch):
    found = examples(page)
    assert found, f"{page} has no Python example"
    (tmp_path / "data").symlink_to(ROOT / "data")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for example in found:
        exec(compile(example, f"{page} example", "exec"), scope)
    # What the examples leave is what they say: a score for every row read.
    import pyarrow.parquet as pq

    features = pq.read_table(ROOT / "data/sample/features.parquet").num_rows
    assert len(scope["scores"]) == features
    if page == "docs/python.md":
        customers = pq.read_table(ROOT / "data/sample/customers.parquet").num_rows
        assert pq.read_table(tmp_path / "out/churn.parquet").num_rows == customers
        assert scope["rows"] == customers
