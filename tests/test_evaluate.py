"""Evaluation harness and schedules: gaps to retraining, reproducible schedules, clear errors for bad ones."""

import csv
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers_eval import tiny_info
from torch import nn
from torch.utils.data import TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig, SampleRecorder, TrajectoryRecorder
from lightning_unlearn.schedule import Schedule, make_schedule, validate_schedule
from lightning_unlearn.unlearners import ACUUnlearner, HFUnlearner, RBMUnlearner, SAFEUnlearner
from lightning_unlearn_bench import (
    TABLE1,
    MethodSpec,
    available_methods,
    evaluate,
    get_method,
    method_spec,
    register,
    unlearner,
)
from lightning_unlearn_bench.report import ATTACK_COLUMNS, ATTACKS
from lightning_unlearn_bench.spec import HARNESS_ARGUMENTS, keyword_options

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def info():
    return tiny_info()


@pytest.fixture(scope="module")
def report(info, tmp_path_factory):
    schedule = make_schedule(info.catalog(), 3, kinds=("samples", "class"), samples_per_request=8, seed=1)
    methods = [
        get_method("acu", expansion_dim=48),
        get_method("retrain", expansion_dim=48),
        get_method("neggrad", expansion_dim=48, epochs=3, lr=1.0, batch_size=8),
        get_method("retrain", family="supervised"),
    ]
    out = tmp_path_factory.mktemp("report")
    return evaluate(methods, info, schedule, out_dir=out, shadows=2), out


def test_retrain_has_zero_gap_to_an_independent_retrain(report):
    rep, _ = report
    for name in ("retrain[analytic,ridge=1,expansion_dim=48]", "retrain[supervised]"):
        rows = rep.table(name)
        assert len(rows) == 3
        assert all(r["l2_to_retrain"] == 0.0 and r["certificate"] == "exact" for r in rows), name
        assert all(r[f"{k}_gap"] == 0.0 for r in rows for k in ("retain_acc", "forget_acc", "test_acc", "mia"))


def test_acu_gaps_are_zero_up_to_floating_point(report):
    rep, _ = report
    s = rep.summary()["acu"]
    # Float64 features and statistics: ACU's head and the retrained one are two float64 ridge solves of a
    # system with cond(R + gamma I) ~ 1e3 (tiny_info, d_F = 48, gamma = 1), each accurate to ~ eps * 1e3
    # relative, and ||W|| ~ 2.6: the gap is ~1e-12 at most; the bound allows 100x that (1e4 * eps * ||W|| * 10)
    assert s["l2_to_retrain"] < 1e4 * torch.finfo(torch.float64).eps * 2.6 * 10
    assert s["retain_gap_pp"] == s["forget_gap_pp"] == s["test_gap_pp"] == s["mia_gap"] == 0.0


def test_neggrad_drives_forget_accuracy_down_and_has_gaps(report):
    rep, _ = report
    rows = rep.table("neggrad")
    # retraining without them still classifies the forgotten samples of learned classes (they generalise);
    # gradient ascent pushes them to be misclassified
    assert rep.table("acu")[0]["forget_acc"] > 0.8
    assert rows[0]["forget_acc"] < rep.table("acu")[0]["forget_acc"] - 0.4
    assert rep.summary()["neggrad"]["l2_to_retrain"] > 0.1
    assert all(r["certificate"] == "none" for r in rows)


def test_report_rows_csv_plot_and_table(report):
    rep, out = report
    assert [r["kind"] for r in rep.table("acu")] == ["samples", "class", "samples"]
    assert [r["n_removed"] for r in rep.table("acu")] == [
        8,
        40 - sum(1 for i in rep.schedule.requests[0].sample_ids if i % 4 == 1),
        8,
    ]
    with (out / "k3_summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert [r["method"] for r in summary] == rep.methods() and set(TABLE1) <= set(summary[0])
    assert [r["family"] for r in summary] == ["analytic", "analytic", "analytic", "supervised"]
    with (out / "k3_requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 * 3 + 2 * 3  # methods and references, 3 requests each
    assert {(r["method"], r["family"]) for r in rows} >= {
        ("acu", "analytic"),
        ("retrain[supervised] (reference)", "supervised"),
    }
    acu_rows = [r for r in rows if r["method"] == "acu"]
    assert {r["reference"] for r in acu_rows} == {"retrain[analytic,ridge=1,expansion_dim=48] (reference)"}
    # every removed id, not the first five: the 8 ids of request 1 and all of request 2's class
    assert [int(i) for i in acu_rows[0]["removed_ids"].split()] == sorted(rep.schedule.requests[0].sample_ids)
    assert len(acu_rows[1]["removed_ids"].split()) == int(acu_rows[1]["n_removed"]) > 5
    assert [r["forget_request"] for r in acu_rows] == [
        "samples[8]",
        f"class={rep.schedule.requests[1].target}",
        "samples[8]",
    ]
    assert (out / "k3_accuracies.png").stat().st_size > 10_000
    text = rep.format()
    assert "K = 3" in text and "neggrad" in text and "dParams(L2)" in text
    assert [line.split()[:2] for line in text.splitlines()[3:]] == [
        ["acu", "analytic"],
        ["retrain[analytic,ridge=1,expansion_dim=48]", "analytic"],
        ["neggrad", "analytic"],
        ["retrain[supervised]", "supervised"],
    ]
    assert len({len(line) for line in text.splitlines()[1:]}) == 1  # aligned columns
    # each row shows its reference's own accuracies (mean over the requests) next to the gaps
    ref_rows = [r for r in rep.reference_rows if r["method"] == "retrain[supervised] (reference)"]
    test_acc = sum(r["test_acc"] for r in ref_rows) / len(ref_rows)
    assert text.splitlines()[-1].split()[-2].split("/")[2] == f"{100 * test_acc:.1f}"


def test_attack_aucs_sit_next_to_the_reference_on_the_same_request(report):
    rep, out = report
    for name in rep.methods():
        rows = rep.table(name)
        ref_rows = [r for r in rep.reference_rows if r["method"] == rows[0]["reference"]]
        for row, ref in zip(rows, ref_rows, strict=True):
            keys = list(row)
            for attack in ATTACKS:
                # the column, then the reference's, which is the same attack on the retrained model after this request
                assert keys[keys.index(attack) + 1] == f"{attack}_retrain"
                assert row[f"{attack}_retrain"] == ref[attack]
                assert 0.0 <= row[attack] <= 1.0 and 0.0 <= ref[attack] <= 1.0  # >= 8 forgotten samples
    # a retrain method and its independent reference are the same model: the same AUCs
    assert all(
        r[a] == r[f"{a}_retrain"]
        for r in rep.table("retrain[supervised]")
        for a in ("mia_u_direct_diff_auc", "lira_auc")
    )
    s = rep.summary()["neggrad"]
    assert set(ATTACK_COLUMNS) <= set(s)
    assert s["lira_auc_retrain"] == sum(r["lira_auc_retrain"] for r in rep.table("neggrad")) / 3
    assert "MIA-U(DD)" in rep.format() and "LiRA" in rep.format()
    with (out / "k3_summary.csv").open() as fh:
        assert set(ATTACK_COLUMNS) <= set(next(csv.DictReader(fh)))


def test_shadow_count_is_checked_and_zero_leaves_lira_out(info):
    schedule = make_schedule(info.catalog(), 1, samples_per_request=8, seed=1)
    with pytest.raises(ValueError, match="shadows >= 2"):
        evaluate([get_method("acu", expansion_dim=48)], info, schedule, shadows=1)
    rep = evaluate([get_method("acu", expansion_dim=48)], info, schedule, shadows=0)
    assert "lira_auc" not in rep.rows[0] and "mia_u_euc_dist_auc_retrain" in rep.rows[0]
    assert "LiRA" not in rep.format() and "MIA-U(Euc)" in rep.format()


def test_schedule_is_reproducible_from_its_seed(info):
    cat = info.catalog()
    a = make_schedule(cat, 4, kinds=("samples", "class", "experience"), samples_per_request=5, seed=3)
    b = make_schedule(cat, 4, kinds=("samples", "class", "experience"), samples_per_request=5, seed=3)
    c = make_schedule(cat, 4, kinds=("samples", "class", "experience"), samples_per_request=5, seed=4)
    assert a == b and a != c
    assert [r.kind for r in a] == ["samples", "class", "experience", "samples"] and a.seed == 3
    ids = validate_schedule(a.requests, cat)
    flat = torch.cat(ids)
    assert flat.unique().numel() == flat.numel()  # disjoint


def test_bad_schedules_give_clear_errors(info):
    cat = info.catalog()
    with pytest.raises(ValueError, match=r"request 1 \(class=7\): class 7 was never learned"):
        validate_schedule([ForgetRequest.samples([0]), ForgetRequest.of_class(7)], cat)
    with pytest.raises(ValueError, match=r"forget requests 0 \(class=1\) and 1 .* overlap in 1 sample ids, e.g. \[5\]"):
        validate_schedule([ForgetRequest.of_class(1), ForgetRequest.samples([0, 5])], cat)
    with pytest.raises(ValueError, match="experience 3 was never learned"):
        validate_schedule([ForgetRequest.of_experience(3)], cat)
    with pytest.raises(ValueError, match="sample ids never learned: \\[9999\\]"):
        validate_schedule([ForgetRequest.samples([9999])], cat)
    with pytest.raises(ValueError, match="nothing would be retained"):
        validate_schedule([ForgetRequest.of_experience(0), ForgetRequest.of_experience(1)], cat)
    with pytest.raises(ValueError, match="every learned class shares samples"):
        make_schedule(cat, 5, kinds=("class",))
    with pytest.raises(ValueError, match="kinds"):
        make_schedule(cat, 2, kinds=("users",))
    bad = Schedule((ForgetRequest.of_class(0), ForgetRequest.of_class(0)))
    with pytest.raises(ValueError, match="overlap"):  # raised before any training
        evaluate([get_method("acu")], info, bad)


def test_registry_names_and_errors():
    assert set(available_methods()) == {
        "acu",
        "retrain",
        "finetune",
        "neggrad",
        "neggrad_plus",
        "randomlabel",
        "scrub",
        "l1_sparse",
        "woodfisher",
        "rbm",
        "salun",
        "hf",
        "ns",
        "ij",
        "ccl_hessian",
        "ccl_gradient",
        "safe",
        "resolve",
        "certified_removal",
        "noisy_finetune",
    }
    with pytest.raises(ValueError, match="unknown method 'sisa'; registered methods: acu"):
        get_method("sisa")
    with pytest.raises(ValueError, match=r"'rbm' \(RBMUnlearner\) takes no option\(s\) \['masking'\]"):
        get_method("rbm", masking="forget")  # fixed by the name: use "salun"
    with pytest.raises(
        ValueError,
        match=r"'hf' \(HFUnlearner\) takes no option\(s\) \['lr'\]; "
        r"its options: \['accountant', 'bound', 'budget', 'capacity', 'delta'",
    ):
        get_method("hf", lr=0.1)
    assert (
        get_method("hf", noise=False).name == "hf[noise=off]"
        and get_method("ccl_hessian", epsilon=2.0).name == "ccl_hessian[eps=2,delta=1e-05]"
    )
    with pytest.raises(
        ValueError, match=r"FinetuneUnlearner\) takes no option\(s\) \['epocs'\]; its options: \['batch_size', 'epochs'"
    ):
        get_method("finetune", epocs=3)
    with pytest.raises(
        ValueError,
        match=r"'acu' \(ACUUnlearner\) takes no option\(s\) \['lr'\]; its options: \['expansion_dim', 'ridge'\]",
    ):
        get_method("acu", lr=0.1)
    with pytest.raises(ValueError, match="already registered"):
        register(MethodSpec("acu", ACUUnlearner, families=("analytic",)))
    with pytest.raises(ValueError, match="unknown model family 'cnn' for method 'neggrad'"):
        get_method("neggrad", family="cnn")
    with pytest.raises(
        ValueError,
        match=r"model family 'analytic' takes no setting\(s\) \['l2'\]; its settings: \['expansion_dim', 'ridge'\]",
    ):
        get_method("finetune", l2=0.1)


def test_registry_options_are_the_strategy_constructors_keyword_only_parameters():
    """Every keyword-only parameter of each registered class is an option, except those the harness sets."""
    for name in available_methods():
        spec = method_spec(name)
        own = keyword_options(spec.strategy) - HARNESS_ARGUMENTS - spec.managed - set(spec.fixed)
        assert own <= spec.options(), (name, own - spec.options())
        assert not (spec.options() & (HARNESS_ARGUMENTS | set(spec.fixed))), name
    # HF: all eleven of its own options (was 4), the linear family's l2 and its recorder's track
    assert method_spec("hf").options() == {
        "release",
        "accountant",
        "budget",
        "epsilon",
        "delta",
        "strong_convexity",
        "smoothness",
        "grad_bound",
        "noise",
        "sigma_override",
        "capacity",
        "max_deletions",
        "bound",
        "l2",
        "lr_margin",
        "track",
    }
    assert keyword_options(HFUnlearner) - HARNESS_ARGUMENTS - method_spec("hf").managed <= method_spec("hf").options()
    assert {
        "forget_weight",
        "lr_constant",
        "expected_rounds",
        "step_size",
        "forget_scope",
        "kl_direction",
        "epsilon",
        "delta",
        "noise",
        "sigma_override",
        "weight_bound",
        "budget",
        "accountant",
        "constants",
        "trajectory",
        "bound",
    } == keyword_options(SAFEUnlearner) - HARNESS_ARGUMENTS
    safe = method_spec("safe")
    assert safe.managed == {"constants", "trajectory"}  # the contraction bound's inputs: the harness sets neither
    assert keyword_options(SAFEUnlearner) - HARNESS_ARGUMENTS - safe.managed <= safe.options()


def test_registry_options_reach_the_strategy_and_names_are_the_certificates_method(info):
    hf = get_method("hf", capacity="error", max_deletions=3, grad_bound=2.0, epsilon=2.0).build(info).strategy()
    assert (hf.capacity, hf.max_deletions, hf.grad_bound, hf.release.epsilon) == ("error", 3, 2.0, 2.0)
    safe = get_method("safe", forget_scope="all", sigma_override=0.5).build(info).strategy()
    assert safe.release.sigma_override == 0.5
    for name in available_methods():
        assert get_method(name).build(info).strategy().method == name, name


def test_registry_reads_one_release_config_from_release_or_its_fields(info):
    given = get_method("hf", release=ReleaseConfig(epsilon=0.5, delta=1e-6))
    assert given.name == get_method("hf", epsilon=0.5, delta=1e-6).name == "hf[eps=0.5,delta=1e-06]"
    assert given.build(info).strategy().release == ReleaseConfig(epsilon=0.5, delta=1e-6)
    noisy = get_method("noisy_finetune", epsilon=2.0).build(info).strategy()
    assert noisy.release == ReleaseConfig(epsilon=2.0, accountant="rdp")  # the fields not given: its default's
    with pytest.raises(ValueError, match=r"give release= or its fields \['epsilon'\], not both"):
        get_method("hf", release=ReleaseConfig(), epsilon=0.5)
    with pytest.raises(ValueError, match="sigma_override must be finite and >= 0, got -1.0"):
        get_method("hf", sigma_override=-1.0)  # refused as the method is configured, before anything trains


class _YourNet(L.LightningModule):
    """A user's module: BatchNorm, dict batches, its own loss and optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self(batch["x"]), batch["y"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_registry_makes_a_named_strategy_on_your_own_module_and_recorder():
    """What the privacy-utility benchmark builds its strategies with: the name's fixed options set, a release's
    fields made one config, the managed options and the constructor's own (``train``) accepted, and an option the
    strategy does not take or the name fixes refused by name."""
    module = _YourNet()
    train = IndexedDataset(TensorDataset(torch.randn(12, 4), torch.randint(0, 3, (12,))))
    salun = unlearner("salun", module, SampleRecorder(), train=train, epochs=2)
    assert (type(salun), salun.masking, salun.epochs, salun.method) == (RBMUnlearner, "forget", 2, "salun")
    hf = unlearner("hf", module, TrajectoryRecorder(), epsilon=0.5, delta=1e-6, bound="paper")
    assert (type(hf), hf.release, hf.bound) == (HFUnlearner, ReleaseConfig(epsilon=0.5, delta=1e-6), "paper")
    with pytest.raises(ValueError, match=r"'salun' \(RBMUnlearner\) takes no option\(s\) \['masking'\] on a module"):
        unlearner("salun", module, SampleRecorder(), train=train, masking="retain")
    with pytest.raises(ValueError, match=r"'hf' \(HFUnlearner\) takes no option\(s\) \['lr'\] on a module"):
        unlearner("hf", module, TrajectoryRecorder(), lr=0.1)
    with pytest.raises(ValueError, match="unknown method 'sisa'"):
        unlearner("sisa", module, SampleRecorder())


def test_every_certified_and_masking_method_runs_in_the_harness(info):
    """HF, [CCL] Hessian/gradient, SAFE, RBM and SalUn on their model families, against their references."""
    schedule = make_schedule(info.catalog(), 2, kinds=("samples", "class"), samples_per_request=8, seed=2)
    names = ["hf", "ccl_hessian", "ccl_gradient", "safe", "rbm", "salun"]
    report = evaluate(
        [get_method(n) for n in names] + [get_method(n, noise=False) for n in ("hf", "ccl_hessian", "ccl_gradient")],
        info,
        schedule,
        shadows=0,
    )
    assert report.methods() == [*names, "hf[noise=off]", "ccl_hessian[noise=off]", "ccl_gradient[noise=off]"]
    refs = {r["method"] for r in report.reference_rows}
    assert refs == {
        "retrain[linear] (reference)",
        "retrain[proximal] (reference)",
        "retrain[supervised] (reference)",
        "retrain (reference)",
    }
    for name, s in report.summary().items():
        assert all(math.isfinite(v) for v in s.values()), name
    guarantees = {m: report._guarantee(m) for m in report.methods()}
    assert guarantees == {
        "hf": "(1,1e-05)",
        "ccl_hessian": "(1,1e-05)",
        "ccl_gradient": "(1,1e-05)",
        "safe": "none",
        "rbm": "none",
        "salun": "none",
        "hf[noise=off]": "none",
        "ccl_hessian[noise=off]": "none",
        "ccl_gradient[noise=off]": "none",
    }
    assert [r["n_removed"] for r in report.table("rbm")] == [r["n_removed"] for r in report.table("hf")]
    # the certified noise is what moves HF's weights away from retraining
    summary = report.summary()
    assert summary["hf[noise=off]"]["l2_to_retrain"] < summary["hf"]["l2_to_retrain"]
    # [CCL]'s Newton correction (tasks solved exactly by L-BFGS) lands closer to retraining than natural
    # forgetting, which leaves the weights as they are (measured: 0.07 vs 0.24)
    hessian, gradient = summary["ccl_hessian[noise=off]"], summary["ccl_gradient[noise=off]"]
    assert hessian["l2_to_retrain"] < 0.5 * gradient["l2_to_retrain"]


def test_library_code_never_sets_a_global_matplotlib_backend():
    """The harness draws with Figure + FigureCanvasAgg; a user's own plots keep their backend."""
    import lightning_unlearn

    root = Path(lightning_unlearn.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if "matplotlib.use(" in p.read_text()]
    assert offenders == []


def test_a_spec_context_supplies_managed_arguments_and_callbacks(info):
    import lightning as L

    from lightning_unlearn.callbacks import TrajectoryRecorder

    check = L.Callback()
    spec = MethodSpec(
        "hf_ctx",
        HFUnlearner,
        families=("linear",),
        recorder=lambda info: TrajectoryRecorder(),
        managed=frozenset({"grad_bound"}),
        context=lambda info, module, s: ({"grad_bound": 5.0}, [check]),
    )
    assert "grad_bound" not in spec.options()
    built = spec.method(epsilon=2.0).build(info)
    assert check in built.callbacks
    strategy = built.strategy()
    assert (strategy.grad_bound, strategy.release.epsilon) == (5.0, 2.0)
    bad = MethodSpec(
        "hf_bad", HFUnlearner, families=("linear",), context=lambda info, module, s: ({"grad_bound": 5.0}, [])
    )
    with pytest.raises(ValueError, match=r"context arguments \['grad_bound'\] are not declared as managed"):
        bad.method().build(info)
