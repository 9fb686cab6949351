"""Two paper rows of one setup that run the same method at two settings (safe-table1's SAFE at K = 2.5 and K = 10)
keep their own rows in the tables instead of being merged under the method's name."""

from lightning_unlearn_bench.repro.journal import Unit
from lightning_unlearn_bench.repro.run import _distinct_methods


def unit(paper_row: str, method: str, options: dict, acc: float, requests: str = "20x400") -> Unit:
    row = {"method": method, "reference": "retrain", "retain_acc": acc, "paper_row": paper_row}
    recipe = {"entry": {"name": method, "paper_row": paper_row, "options": options}, "scale_options": {}}
    ref = [{"method": "retrain", "retain_acc": 0.9}]
    return Unit("MNIST", requests, paper_row, method, "d", recipe, {}, [row], [dict(row)], ref, [], 1.0)


def test_one_method_at_two_settings_is_named_by_the_options_that_differ():
    units = {
        ("20x400", "SAFE"): unit("SAFE", "safe", {"forget_weight": 1000, "lr_constant": 2.5}, 0.6),
        ("20x400", "SAFE (K=10)"): unit("SAFE (K=10)", "safe", {"forget_weight": 1000, "lr_constant": 10}, 0.9),
        ("20x400", "Other"): unit("Other", "hf", {}, 0.8),
        ("other set", "SAFE"): unit("SAFE", "safe", {"lr_constant": 2.5}, 0.7, requests="other set"),
    }
    named = _distinct_methods(units)
    assert named[("20x400", "SAFE")].method == "safe[lr_constant=2.5]"
    assert named[("20x400", "SAFE (K=10)")].method == "safe[lr_constant=10]"
    # every row follows its unit's name; each row keeps its own numbers
    for key in (("20x400", "SAFE"), ("20x400", "SAFE (K=10)")):
        u = named[key]
        assert {r["method"] for r in u.rows + u.end_rows} == {u.method}
        assert u.rows[0]["retain_acc"] == units[key].rows[0]["retain_acc"]
    # a method that runs once per request set keeps its name; the input is not modified
    assert named[("20x400", "Other")].method == "hf" and named[("other set", "SAFE")].method == "safe"
    assert units[("20x400", "SAFE")].method == "safe" and units[("20x400", "SAFE")].rows[0]["method"] == "safe"


def test_same_options_fall_back_to_the_paper_row():
    units = {
        ("k", "A"): unit("A", "safe", {"lr_constant": 2.5}, 0.6),
        ("k", "B"): unit("B", "safe", {"lr_constant": 2.5}, 0.9),
    }
    named = _distinct_methods(units)
    assert [named[k].method for k in units] == ["safe (A)", "safe (B)"]
