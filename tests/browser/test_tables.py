"""Numbers sit under their headers: numeric columns are right-aligned in the header as in the cells
(the "Cluster capacity" table on /shares/ had left-aligned headers over right-aligned numbers)."""

import pytest

from tests.browser.conftest import login

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RIGHT_EDGES = """table => {
  const heads = [...table.querySelectorAll("thead th")];
  const row = table.querySelector("tbody tr");
  return heads.map((th, i) => {
    const td = row.children[i];
    const text = el => { const r = document.createRange(); r.selectNodeContents(el); return r.getBoundingClientRect(); };
    return {num: th.classList.contains("num"), th: text(th).right, td: text(td).right};
  });
}"""


def test_cluster_capacity_numbers_sit_under_their_headers(page, alice, vision_share, nodes):
    login(page, alice)
    page.goto("/shares/")
    table = page.locator("section", has_text="Cluster capacity").locator("table")
    columns = table.evaluate(RIGHT_EDGES)
    numeric = [c for c in columns if c["num"]]
    assert len(numeric) == 3
    for c in numeric:
        assert abs(c["th"] - c["td"]) < 2, columns
