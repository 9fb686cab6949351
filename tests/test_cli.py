"""`lightning-unlearn` CLI: jsonargparse options and configs, the listing from the registry, the compare table,
the user's own module and data by class path, and errors that name the bad argument (exit 2, no traceback)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_own import FITS

from lightning_unlearn.cli import build_parser, main, method_options
from lightning_unlearn.harness import MethodSpec, get_method, method_spec, registry
from lightning_unlearn.unlearners import FinetuneUnlearner

pytestmark = pytest.mark.slow

QUICK = ["compare", "--experiences", "2", "--pretrain_epochs", "1", "--epochs", "1", "--progress", "false"]
QUICK += ["--shadows", "2"]


def test_methods_lists_every_registered_method_from_its_spec(capsys, monkeypatch):
    # a method registered by a user is listed like the built-in ones, its options read from its class's signature
    mine = MethodSpec("mine", FinetuneUnlearner, families=("supervised",), guarantee="none (mine)", cost="one fit")
    monkeypatch.setitem(registry._SPECS, "mine", mine)
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    blocks = {b.split()[0]: b for b in out.split("\n\n")}
    assert set(registry.available_methods()) <= set(blocks)
    for name in registry.available_methods():
        spec = method_spec(name)
        block = " ".join(blocks[name].split())  # undo the wrapping
        assert f"guarantee: {spec.guarantee}" in block and f"needs: {spec.needs()}" in block, name
        for option in spec.option_list():
            assert f"{option.name}: {option.type_text()} = {option.default!r}" in block, (name, option.name)
    mine_block = " ".join(blocks["mine"].split())
    assert "epochs: int = 10, lr: float | None = None" in mine_block
    assert "guarantee: none (mine)" in mine_block and "cost: one fit" in mine_block
    assert "epsilon: float = 1.0" in blocks["hf"] and "retained data + the samples to forget" in blocks["rbm"]


def test_methods_name_prints_its_options_with_types_defaults_and_destination(capsys):
    assert main(["methods", "hf"]) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line for line in out.split("------\n")[-1].splitlines() if line.strip()}
    assert table["epsilon"].split() == ["epsilon", "float", "1.0", "strategy", "HFUnlearner"]
    assert table["track"].split() == ["track", "Collection[int]", "|", "None", "None", "recorder"]
    assert table["l2"].split() == ["l2", "float", "0.01", "setting", "of", "family", "linear"]
    assert "Eq. (56)" in out and "set with --method.hf.OPTION=VALUE" in out


def test_compare_runs_exact_certified_masking_and_baseline_methods_together(capsys):
    argv = [*QUICK, "--methods", "[acu,hf,hessian,rbm,finetune,neggrad,retrain]", "--requests", "[2]"]
    assert main([*argv, "--method.hf.noise", "false"]) == 0  # option words in lower case, as a shell user types them
    table = capsys.readouterr().out.split("K = 2")[1].strip().splitlines()[3:10]
    guarantee = {row.split()[0]: row.split()[-1] for row in table}
    assert guarantee == {
        "acu": "exact",
        "hf[noise=off]": "none",
        "hessian": "(1,1e-05)",
        "rbm": "none",
        "finetune": "none",
        "neggrad": "none",
        "retrain": "exact",
    }
    family = {row.split()[0]: row.split()[1] for row in table}
    assert family == {
        "acu": "analytic",
        "hf[noise=off]": "linear",
        "hessian": "proximal",
        "rbm": "analytic",
        "finetune": "analytic",
        "neggrad": "analytic",
        "retrain": "analytic",
    }


@pytest.mark.parametrize("word, value", [("false", False), ("False", False), ("FALSE", False), ("true", True)])
def test_option_words_are_read_in_any_case(word, value):
    cfg = build_parser().parse_args(["compare", "--methods", "[hf]", "--method.hf.noise", word]).compare
    options = method_options(cfg.methods, cfg.method)
    assert options == {"hf": {} if value else {"noise": False}}  # only what differs from the default is passed
    assert get_method("hf", **options["hf"]).name == ("hf" if value else "hf[noise=off]")


def test_print_config_writes_a_config_that_reads_back_and_flags_override_it(capsys, tmp_path):
    argv = ["compare", "--methods", "[acu,finetune]", "--method.finetune.epochs", "3"]
    argv += ["--trainer.precision", "bf16-mixed"]
    with pytest.raises(SystemExit) as done:
        main([*argv, "--print_config"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    config = yaml.safe_load(printed)
    assert config["methods"] == ["acu", "finetune"] and config["method"]["finetune"]["epochs"] == 3
    assert config["method"]["hf"]["epsilon"] == 1.0 and config["trainer"]["precision"] == "bf16-mixed"
    path = tmp_path / "run.yaml"
    path.write_text(printed)
    cfg = build_parser().parse_args(["compare", "--config", str(path), "--method.finetune.lr", "0.5"]).compare
    assert method_options(cfg.methods, cfg.method) == {"acu": {}, "finetune": {"epochs": 3, "lr": 0.5}}
    assert cfg.trainer.precision == "bf16-mixed"


def test_compare_prints_an_aligned_table_per_k_and_writes_files(capsys, tmp_path):
    argv = [*QUICK, "--methods", "[acu,neggrad]", "--requests", "[2,3]", "--out", str(tmp_path)]
    argv += ["--method.neggrad.epochs", "1", "--method.neggrad.expansion_dim", "64", "--method.acu.expansion_dim", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for k in (2, 3):
        assert f"K = {k} requests (samples, seed 0)" in out
        assert (tmp_path / f"k{k}_summary.csv").exists() and (tmp_path / f"k{k}_accuracies.png").exists()
    table = out.split("K = 2")[1].split("K = 3")[0].strip().splitlines()
    header, rule, acu_row, neggrad_row = table[1:5]
    assert header.split()[:4] == ["method", "family", "dParams(L2)", "dRetain(pp)"] and set(rule) == {"-"}
    assert acu_row.split()[:2] == ["acu", "analytic"] and acu_row.split()[2:7] == ["0.00"] * 5
    assert acu_row.split()[-1] == "exact"
    assert neggrad_row.split()[:2] == ["neggrad", "analytic"] and neggrad_row.split()[-1] == "none"
    assert len(header) == len(acu_row) == len(neggrad_row)
    attacks = ["MIA-U(DD)", "MIA-U(Euc)", "LiRA", "TPR@0.1%", "TPR@1%"]
    attacks = [col for head in attacks for col in (head, "[retr]")]
    assert header.split()[-13:-3] == attacks


def test_compare_your_module_and_datamodule_by_class_path_with_trainer_options_in_every_fit(capsys, tmp_path):
    FITS.clear()
    argv = ["compare", "--model", "helpers_own.UserNet", "--model.width", "8", "--data", "helpers_own.UserData"]
    argv += ["--methods", "[retrain,finetune]", "--method.finetune.epochs", "1", "--requests", "[2]", "--epochs", "1"]
    argv += ["--shadows", "0", "--progress", "false", "--trainer.default_root_dir", str(tmp_path)]
    argv += ["--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "logs")]
    assert main(argv) == 0
    rows = {r.split()[0]: r.split() for r in capsys.readouterr().out.split("K = 2")[1].strip().splitlines()[3:5]}
    assert rows["retrain"][1:3] == ["own", "0.00"] and rows["retrain"][-1] == "exact"
    assert rows["finetune"][1] == "own" and float(rows["finetune"][2]) > 0 and rows["finetune"][-1] == "none"
    # 9 fits (the reference's and the retrain method's: a stream fit and a retraining per request; finetune's:
    # a stream fit and a fine-tuning per request), each with the --trainer options; one logger object for all
    assert [root for root, _ in FITS] == [str(tmp_path)] * 9
    assert len({id(logger) for _, logger in FITS}) == 1 and type(FITS[0][1]).__name__ == "CSVLogger"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "[acu,sisa]"], "unknown method 'sisa'; registered methods:"),
        (["--methods", "acu,hf"], 'Parser key "methods"'),
        (["--methods", "[acu]", "--method.acu.ridge", "abc"], 'Parser key "method.acu.ridge"'),
        (["--methods", "[acu]", "--method.finetune.epochs", "2"], "is set, but 'finetune' is not among --methods"),
        (["--methods", "[finetune]", "--method.finetune.epocs", "2"], "unrecognized arguments: --method.finetune.epoc"),
        (["--requests", "[0]"], "Not of type PositiveInt: 0"),
        (["--methods", "[acu]", "--kinds", "[users]"], "Got value: users"),
        (["--methods", "[acu]", "--root", "/tmp"], "--root: only for a --data benchmark from files"),
        (["--methods", "[acu]", "--data", "split-cifar10"], "--data split-cifar10 reads its files from --root DIR"),
        (["--methods", "[acu]", "--trainer.precision", "17"], 'Parser key "trainer.precision"'),
        (["--methods", "[acu]", "--model", "no_such_module.Net"], 'Parser key "model"'),
    ],
)
def test_bad_arguments_exit_with_a_clear_message(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*QUICK, *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unknown_key_in_a_config_file_is_named(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("methods: [acu]\nmethod:\n  acu:\n    ridge: 2.0\n    gamma: 1.0\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--config", str(path)])
    assert exit_info.value.code == 2 and "gamma" in capsys.readouterr().err


def test_console_script_is_installed():
    script = shutil.which("lightning-unlearn", path=str(Path(sys.executable).parent))
    assert script is not None
    done = subprocess.run([script, "methods"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "neggrad_plus (NegGradPlusUnlearner" in done.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--methods", "[hf,foo]"], "unknown certified method"),
        (["--fraction", "1.5"], "--fraction must lie in"),
        (["--epsilons", "[1,-2]"], "Not of type PositiveFloat: -2"),
    ],
)
def test_tradeoff_refuses_bad_arguments_before_training(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["tradeoff", *extra])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_tradeoff_on_your_datamodule_logs_to_your_logger(capsys, tmp_path):
    argv = ["tradeoff", "--data", "helpers_own.UserData", "--data.n", "80", "--fraction", "0.1", "--epsilons", "[1]"]
    argv += ["--methods", "[gradient]", "--epochs", "15", "--batch_size", "8"]
    argv += ["--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path)]
    assert main(argv) == 0
    title, _, _, *rows = capsys.readouterr().out.strip().splitlines()
    assert title.startswith("Privacy-utility tradeoff (UserData,")
    assert [r.split()[:2] for r in rows] == [
        ["retrain[lbfgs]", "inf"],
        ["never_forgot[lbfgs]", "inf"],
        ["gradient", "inf"],
        ["gradient", "1"],
    ]
    assert rows[3].split()[-3] == "yes"  # certified at epsilon 1
    # the fits ran with the user's logger: the requests' metrics went to it (Lightning's CSV format)
    (metrics,) = tmp_path.glob("lightning_logs/version_*/metrics.csv")
    assert "unlearn/sigma" in metrics.read_text().splitlines()[0].split(",")


def test_reproduce_setups_takes_one_label_or_a_list():
    parse = build_parser().parse_args
    assert parse(["reproduce", "hf-table2", "--setups", "MNIST LR"]).reproduce.setups == "MNIST LR"
    assert parse(["reproduce", "hf-table2", "--setups", '["MNIST LR", "MNIST CNN"]']).reproduce.setups == [
        "MNIST LR",
        "MNIST CNN",
    ]
