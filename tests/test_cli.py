"""`lightning-unlearn` CLI: jsonargparse options and configs, the listing from the registry, the compare table,
the user's own module and data by class path, and errors that name the bad argument (exit 2, no traceback)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_own import FITS

from lightning_unlearn.unlearners import FinetuneUnlearner
from lightning_unlearn_bench import MethodSpec, get_method, method_spec, registry
from lightning_unlearn_bench.cli import build_parser, list_methods, main, method_options, plain_text

pytestmark = pytest.mark.slow

QUICK = ["compare", "--experiences", "2", "--pretrain_epochs", "1", "--epochs", "1", "--progress", "false"]
QUICK += ["--shadows", "2"]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods"


@pytest.fixture(scope="module")
def parser():
    return build_parser()


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
    argv = [*QUICK, "--methods", "[acu,hf,ccl_hessian,rbm,finetune,neggrad,retrain]", "--requests", "[2]"]
    assert main([*argv, "--method.hf.noise", "false"]) == 0  # option words in lower case, as a shell user types them
    table = capsys.readouterr().out.split("K = 2")[1].strip().splitlines()[3:10]
    guarantee = {row.split()[0]: row.split()[-1] for row in table}
    assert guarantee == {
        "acu": "exact",
        "hf[noise=off]": "none",
        "ccl_hessian": "(1,1e-05)",
        "rbm": "none",
        "finetune": "none",
        "neggrad": "none",
        "retrain": "exact",
    }
    family = {row.split()[0]: row.split()[1] for row in table}
    assert family == {
        "acu": "analytic",
        "hf[noise=off]": "linear",
        "ccl_hessian": "proximal",
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
        (["--methods", "[acu,hf"], 'Parser key "methods"'),  # a broken YAML list; acu,hf is a list (test below)
        (["--methods", "acu,sisa"], "unknown method 'sisa'; registered methods:"),
        (["--methods", "[acu]", "--method.acu.ridge", "abc"], 'Parser key "method.acu.ridge"'),
        (["--methods", "[acu]", "--method.finetune.epochs", "2"], "is set, but 'finetune' is not among --methods"),
        (["--methods", "[finetune]", "--method.finetune.epocs", "2"], "unrecognized arguments: --method.finetune.epoc"),
        (["--requests", "[0]"], "Not of type PositiveInt: 0"),
        (["--requests", "5,0"], "Not of type PositiveInt: 0"),
        (["--methods", "[acu]", "--kinds", "[users]"], "Got value: users"),
        (["--methods", "acu", "--kinds", "users"], "Got value: users"),
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
    argv += ["--methods", "[ccl_gradient]", "--epochs", "15", "--batch_size", "8"]
    argv += ["--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path)]
    assert main(argv) == 0
    title, _, _, *rows = capsys.readouterr().out.strip().splitlines()
    assert title.startswith("Privacy-utility tradeoff (UserData,")
    assert [r.split()[:2] for r in rows] == [
        ["retrain[lbfgs]", "inf"],
        ["never_forgot[lbfgs]", "inf"],
        ["ccl_gradient", "inf"],
        ["ccl_gradient", "1"],
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


@pytest.mark.parametrize(
    ("rest", "text"),
    [
        (":func:`~lightning_unlearn_bench.own.compare_with_retrain`", "compare_with_retrain"),
        (":mod:`lightning_unlearn_bench.tradeoff`", "lightning_unlearn_bench.tradeoff"),
        (":class:`the head <lightning_unlearn.AnalyticHead>` learns", "the head learns"),
        (":py:meth:`~.MethodSpec.option_list`", "option_list"),
        ("If :paramref:`~lightning.pytorch.trainer.trainer.Trainer.deterministic` is", "If deterministic is"),
        ("``--data x --root DIR\n--model y`` a benchmark", "--data x --root DIR\n--model y a benchmark"),
        ("``x`` and ``'32-true'``, `s3://bucket/path`", "x and '32-true', s3://bucket/path"),
        ("and DataModule::\n\n    lightning-unlearn methods", "and DataModule:\n\n    lightning-unlearn methods"),
        ("plain: a, b -- [acu,hf] 50% done", "plain: a, b -- [acu,hf] 50% done"),
    ],
)
def test_plain_text_shows_rest_roles_and_literals_as_their_text(rest, text):
    assert plain_text(rest) == text


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--help"], "(lightning_unlearn_bench.own.compare_with_retrain). tradeoff prints"),
        (["compare", "--help"], "If deterministic is set to True, this will default to False"),  # Lightning's docstring
        (["tradeoff", "--help"], "Default: os.getcwd(). Can be remote file paths such as s3://mybucket/path"),
        (["reproduce", "--help"], 'or "auto" for automatic selection'),
        (["methods", "--help"], "one method: its options with types and defaults"),
        (["compare", "--trainer.logger.help", "CSVLogger"], "Defaults to 'lightning_logs'. If name is None"),
    ],
)
def test_help_is_plain_text(capsys, argv, shown):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "`" not in out and re.search(r":[a-z]+:", out) is None, out
    assert shown in " ".join(out.split())  # the wrapping undone


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["compare", "--methods", "acu"], "methods", ["acu"]),
        (["compare", "--methods", "acu,hf"], "methods", ["acu", "hf"]),
        (["compare", "--methods", "[acu,hf]"], "methods", ["acu", "hf"]),
        (["compare", "--methods=acu,hf"], "methods", ["acu", "hf"]),
        (["compare", "--methods", "acu", "--methods+", "hf,rbm"], "methods", ["acu", "hf", "rbm"]),
        (["compare", "--requests", "5"], "requests", [5]),
        (["compare", "--requests", "5,25"], "requests", [5, 25]),
        (["compare", "--kinds", "class,experience"], "kinds", ["class", "experience"]),
        (["compare", "--method.hf.track", "3"], "method.hf.track", [3]),
        (["compare", "--method.hf.track", "3,4"], "method.hf.track", [3, 4]),
        (["compare", "--method.hf.track", "null"], "method.hf.track", None),
        (["tradeoff", "--epsilons", "1"], "epsilons", [1.0]),
        (["tradeoff", "--epsilons", "0.5,1"], "epsilons", [0.5, 1.0]),
        (["tradeoff", "--epsilons", "[0.5,1]"], "epsilons", [0.5, 1.0]),
        (["tradeoff", "--methods", "resolve"], "methods", ["resolve"]),
        # a union with other types keeps jsonargparse's reading: "1" (Lightning: one device), not [1] (device 1)
        (["compare", "--trainer.devices", "1"], "trainer.devices", "1"),
        (["reproduce", "hf-table2", "--setups", "MNIST LR"], "setups", "MNIST LR"),
    ],
)
def test_list_options_take_one_item_items_separated_by_commas_or_a_yaml_list(parser, argv, key, value):
    assert parser.parse_args(argv)[argv[0]][key] == value


def test_every_list_option_of_every_command_takes_bare_items(capsys, parser):
    checked = set()
    for name in ("compare", "tradeoff", "reproduce"):
        with pytest.raises(SystemExit):
            main([name, "--print_config"])
        for key, default in yaml.safe_load(capsys.readouterr().out).items():
            if not isinstance(default, list) or not default:
                continue
            items = default[:2]
            text = ",".join(str(item) for item in items)
            for value, expected in ((str(items[0]), items[:1]), (text, items), (f"[{text}]", items)):
                assert parser.parse_args([name, f"--{key}", value])[name][key] == expected, (name, key, value)
            checked.add(f"{name} --{key}")
    assert {"compare --methods", "compare --requests", "compare --kinds"} <= checked
    assert {"tradeoff --epsilons", "tradeoff --methods"} <= checked


def test_compare_runs_resolve_by_default(parser):
    methods = parser.parse_args(["compare"]).compare.methods
    assert "resolve" in methods and set(methods) <= set(registry.available_methods())


def test_every_method_named_in_the_docs_is_registered_and_described(parser):
    index = (DOCS / "index.md").read_text()
    # a method's row links its page, or its section of its family's page (ccl.md#ccl_hessian)
    rows = re.findall(r"^\| \[[^\]]+\]\((\w+)\.md(?:#(\w+))?\) \(([^)]*)\) \|", index, flags=re.MULTILINE)
    assert sorted({page for page, _, _ in rows}) == sorted(p.stem for p in DOCS.glob("*.md") if p.stem != "index")
    names = [label.strip("`") for _, _, label in rows if re.fullmatch(r"`\w+`", label)]
    assert sorted(names) == registry.available_methods()  # each registered method documented, each name registered
    for page, section, label in rows:
        text = (DOCS / f"{page}.md").read_text()
        if label == "not in the registry":  # a library class outside the registry says so on its page too
            assert "not in the harness registry" in text, page
            continue
        name = label.strip("`")
        if section:  # a family's page: the method's section is headed by its key
            assert section == name and re.search(rf"^## `{name}`: .* {{ #{name} }}$", text, flags=re.MULTILINE), page
        else:
            assert page == name and text.splitlines()[0].endswith(f"(`{name}`)"), page
        assert list_methods(parser.parse_args(["methods", name]).methods.name).startswith(f"{name}: ")
