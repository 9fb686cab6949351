"""Reproduction configs as YAML data: the shipped files load into the typed schema, a user's edited copy runs by
path, and a bad file is refused naming the file and the key."""

from dataclasses import replace

import pytest

from lightning_unlearn_bench.cli import main
from lightning_unlearn_bench.papers import CONFIGS, config_path, dump_config, get_config, list_configs, load_config
from lightning_unlearn_bench.repro import Requests, Scale, run_config
from lightning_unlearn_bench.repro.validate import ConfigError, config_from_dict, config_to_dict

BUILT_IN = ("acu-table1", "hf-table2", "hf-table6", "safe-table1", "rbm-table2", "ccl-table1", "ccl-fig2")


def test_every_paper_table_ships_as_a_yaml_file_that_round_trips():
    assert tuple(CONFIGS) == BUILT_IN
    for name, config in CONFIGS.items():
        path = config_path(name)
        assert path.suffix == ".yaml" and path.parent.name == "configs" and config.name == name
        assert load_config(path) == config
        assert config_from_dict(config_to_dict(config)) == config  # written and read back: the same config
    # spot checks against the papers' tables: hf-table2's recipe and cells, a derived per-sample cell of Table 6
    hf = CONFIGS["hf-table2"].setups[0]
    assert (hf.full.dataset, hf.full.lr, hf.full.epochs, hf.full.batch_size) == ("split-mnist", 0.05, 15, 32)
    assert hf.paper[("20% single", "HF")]["Speedup"] == 93376 and hf.paper[("20% single", "Retrain")] == {"TA": 87.75}
    cifar = next(s for s in CONFIGS["hf-table6"].setups if s.label == "CIFAR-10 ResNet-18")
    assert cifar.paper[("50 single", "HF")]["Precompute(s)"] == pytest.approx(50 * 184.53, rel=1e-12)


def test_an_edited_copy_runs_by_path(tmp_path, capsys):
    config = get_config("acu-table1")
    setup = config.setups[0]
    smoke = replace(setup.smoke, per_class=6, n_experiences=2, pretrain_epochs=1, requests=(Requests("K=5", k=2),))
    smoke = replace(smoke, options={})  # options of the methods left out would be refused (a typo'd name)
    text = dump_config(replace(config, setups=(replace(setup, smoke=smoke, methods=setup.methods[:1]),)))
    path = tmp_path / "my.yaml"
    path.write_text(text.replace("lr: 0.1\n", "lr: 0.2\n", 1))  # the smoke scale's first lr, edited by hand
    mine = get_config(path)
    assert mine.setups[0].smoke.lr == 0.2 and mine.setups[0].smoke.epochs == 1 and mine.name == "acu-table1"
    assert main(["reproduce", str(path), "--smoke"]) == 0
    out = capsys.readouterr().out
    assert "acu [ACU]" in out and "(0.00)" in out  # our ACU row next to the paper's zero gaps


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["setups"][0]["full"].update(epoch=3), r"setups\[0\]\.full\.epoch: unknown key; Scale takes"),
        (lambda d: d["setups"][0]["full"].update(lr="fast"), r"setups\[0\]\.full\.lr: expected a finite number"),
        (lambda d: d["setups"][0]["smoke"].pop("epochs"), r"setups\[0\]\.smoke: missing key\(s\) epochs of Scale"),
        (lambda d: d["setups"][1].update(protocol="streaming"), r"setups\[1\]\.protocol: 'streaming' is not one of"),
        (lambda d: d.update(columns=["TA", "dAcc"]), r"columns\[1\]: 'dAcc' is not one of"),
        (lambda d: d["setups"][0]["full"]["requests"][0].update(k=0), r"full\.requests\[0\]\.k: must be at least 1"),
        (lambda d: d["setups"][0]["paper"]["20% single"].update(FT={"RA": 1}), r"single\.FT\.RA: 'RA' is not one of"),
        (lambda d: d["setups"][0]["paper"].update(K5={"HF": {}}), r"paper\.K5: no request set of this setup"),
        (lambda d: d["setups"][0]["smoke"].update(options={"hff": {}}), r"smoke\.options\.hff: 'hff' is not one of"),
        (lambda d: d["setups"][0]["methods"][0].update(options=[1]), r"methods\[0\]\.options: expected a mapping"),
        (lambda d: d.update(aggregate="median"), r"aggregate: 'median' is not one of mean, last"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, edit, message):
    import yaml

    data = config_to_dict(get_config("hf-table2"))
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=message) as err:
        get_config(path)
    assert str(err.value).startswith(f"{path}: ")


def test_numbers_in_exponent_notation_are_numbers_and_unknown_names_are_refused_before_training(tmp_path, capsys):
    text = dump_config(get_config("hf-table2")).replace("delta: 0.001", "delta: 1e-3")
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    assert get_config(path).setups[0].methods[0].options["delta"] == 1e-3  # YAML 1.1 alone reads '1e-3' as text
    path.write_text(text.replace("name: ns,", "name: newton,", 1))
    with pytest.raises(SystemExit):
        main(["reproduce", str(path), "--smoke"])
    assert "setup 'MNIST LR': unknown method 'newton'; registered:" in capsys.readouterr().err
    scale = Scale("digits", "linear", epochs=1, lr=0.1, batch_size=8, requests=(Requests("20% single"),))
    config = get_config("hf-table2")
    bad = replace(config, setups=(replace(config.setups[0], smoke=replace(scale, options={"hf": {"l3": 1}})),))
    with pytest.raises(ValueError, match=r"setup 'MNIST LR', HF: method 'hf' .* takes no option\(s\) \['l3'\]"):
        run_config(bad, smoke=True, log=lambda _: None)
    with pytest.raises(ValueError, match="one of acu-table1, hf-table2.* or a YAML file"):
        get_config(tmp_path / "missing.yaml")


def test_the_listing_names_each_file_and_what_runs_without_root():
    listing = list_configs()
    for name in BUILT_IN:
        assert str(config_path(name)) in listing
    assert "MNIST LR*, MNIST CNN*" in listing and "CIFAR-10, CIFAR-100 " in listing
