"""`lightning-unlearn` CLI: the compare table, output files, and errors that name the bad argument."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_unlearn.cli import _options, main
from lightning_unlearn.harness import get_method

pytestmark = pytest.mark.slow

QUICK = ["compare", "--experiences", "2", "--pretrain-epochs", "1", "--epochs", "1", "--no-progress", "--shadows", "2"]


def test_methods_lists_the_registry(capsys):
    assert main(["methods"]) == 0
    names = capsys.readouterr().out.split()
    assert {"acu", "hf", "hessian", "gradient", "safe", "rbm", "salun", "retrain", "finetune", "neggrad"} <= set(names)


def test_compare_runs_exact_certified_masking_and_baseline_methods_together(capsys):
    # option words in lower case, as a shell user types them
    argv = [
        *QUICK,
        "--methods",
        "acu,hf,hessian,rbm,finetune,neggrad,retrain",
        "--requests",
        "2",
        "--option",
        "hf.noise=false",
    ]
    assert main(argv) == 0
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


@pytest.mark.parametrize(
    "word, value", [("false", False), ("False", False), ("FALSE", False), ("true", True), ("none", None)]
)
def test_option_words_are_read_in_any_case(word, value):
    assert _options([f"hf.noise={word}"], ["hf"]) == {"hf": {"noise": value}}
    if isinstance(value, bool):
        assert get_method("hf", **_options([f"hf.noise={word}"], ["hf"])["hf"]).name == (
            "hf" if value else "hf[noise=off]"
        )


def test_compare_prints_an_aligned_table_per_k_and_writes_files(capsys, tmp_path):
    argv = [
        *QUICK,
        "--methods",
        "acu,neggrad",
        "--requests",
        "2,3",
        "--out",
        str(tmp_path),
        "--option",
        "neggrad.epochs=1",
        "--option",
        "neggrad.expansion_dim=64",
        "--option",
        "acu.expansion_dim=64",
    ]
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
    assert header.split()[-9:-3] == ["MIA-U(DD)", "[retr]", "MIA-U(Euc)", "[retr]", "LiRA", "[retr]"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "acu,sisa"], "unknown method 'sisa'; registered methods:"),
        (["--methods", "acu", "--option", "acu.ridge"], "--option takes METHOD.KEY=VALUE"),
        (
            ["--methods", "acu", "--option", "finetune.epochs=2"],
            "names method 'finetune', which is not among --methods",
        ),
        (["--methods", "finetune", "--option", "finetune.epocs=2"], "takes no option"),
        (["--requests", "0"], "expected positive integers"),
        (["--methods", "acu", "--kinds", "users"], "--kinds takes samples, class and/or experience"),
    ],
)
def test_bad_arguments_exit_with_a_clear_message(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*QUICK, *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_is_installed():
    script = shutil.which("lightning-unlearn", path=str(Path(sys.executable).parent))
    assert script is not None
    done = subprocess.run([script, "methods"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "neggrad_plus" in done.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--methods", "hf,foo"], "unknown certified method"),
        (["--fraction", "1.5"], "--fraction must lie in"),
        (["--epsilons", "1,-2"], "expected positive numbers"),
    ],
)
def test_tradeoff_refuses_bad_arguments_before_training(capsys, extra, message):
    with pytest.raises(SystemExit):
        main(["tradeoff", *extra])
    assert message in capsys.readouterr().err
