import dataclasses

import pytest
import yaml
from conftest import ROOT

from transformer_mt.config import Config, apply_overrides, config_from_dict, documented_yaml, load_config
from transformer_mt.errors import ConfigError


@pytest.mark.parametrize("name", ["tiny", "tatoeba_en_it", "tatoeba_en_it_d256", "tatoeba_en_it_word",
                                  "tatoeba_en_it_unigram", "opus_books_en_it"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.name == name


def test_reference_config_documents_every_key():
    text = (ROOT / "configs" / "reference.yaml").read_text()
    for section, values in Config().to_dict().items():
        keys = values if isinstance(values, dict) else {section: values}
        for key in keys:
            assert f"{key}:" in text, f"{section}.{key} is not documented in the reference config"


def test_reference_config_shows_the_true_defaults_and_is_generated_from_the_specs():
    path = ROOT / "configs" / "reference.yaml"
    assert load_config(path) == Config()
    assert path.read_text(encoding="utf-8") == documented_yaml(), \
        "configs/reference.yaml is stale: regenerate it with tmt train --print-config"


def test_every_key_has_help_text_next_to_its_default():
    sections = [Config] + [type(value) for value in vars(Config()).values()
                           if dataclasses.is_dataclass(value)]
    for cls in sections:
        for f in dataclasses.fields(cls):
            assert len(f.metadata.get("help", "")) > 5, f"{cls.__name__}.{f.name} has no help"


def test_documented_yaml_of_a_config_loads_back_to_it():
    cfg = load_config(ROOT / "configs" / "tatoeba_en_it.yaml", ["train.lr=3e-4"])
    text = documented_yaml(cfg)
    assert config_from_dict(yaml.safe_load(text)) == cfg
    assert "# peak learning rate" in text and "lr: 0.0003" in text


def test_reference_hyperparameters():
    m = load_config(ROOT / "configs" / "opus_books_en_it.yaml")
    assert (m.model.d_model, m.model.layers, m.model.heads, m.model.d_ff) == (512, 6, 8, 2048)
    assert m.model.dropout == 0.1 and m.train.label_smoothing == 0.1


def test_unknown_key_names_section_and_closest_key():
    with pytest.raises(ConfigError, match=r"unknown key 'lerning_rate' in section 'train'"):
        config_from_dict({"train": {"lerning_rate": 1}})
    with pytest.raises(ConfigError, match=r"did you mean 'd_model'"):
        config_from_dict({"model": {"dmodel": 1}})
    with pytest.raises(ConfigError, match=r"unknown top-level key 'modle'.*'model'"):
        config_from_dict({"modle": {}})


@pytest.mark.parametrize("raw, message", [
    ({"train": {"lr": "fast"}}, r"train\.lr: must be a number"),
    ({"train": {"lr": -0.1}}, r"train\.lr: must be > 0"),
    ({"model": {"layers": 2.5}}, r"model\.layers: must be an integer"),
    ({"model": {"layers": True}}, r"model\.layers: must be an integer"),
    ({"model": {"dropout": 1.0}}, r"model\.dropout: must be < 1"),
    ({"model": {"norm": "middle"}}, r"model\.norm: must be one of pre, post"),
    ({"model": {"d_model": 100, "heads": 8}}, r"divisible by model\.heads"),
    ({"train": {"adam_betas": [0.9]}}, r"adam_betas"),
    ({"data": {"source": "tsv"}}, r"data\.path is required"),
    ({"data": "oops"}, r"section 'data': must be a mapping"),
    ({"tokenizer": {"type": "bpe", "max_vocab": 8000}}, r"model\.tie_embeddings: true"),
    ({"tokenizer": {"type": "bpe"}, "model": {"tie_embeddings": True}},
     r"tokenizer\.max_vocab is required"),
    ({"tokenizer": {"type": "unigram"}, "model": {"tie_embeddings": True}},
     r"max_vocab is required when tokenizer\.type is 'unigram'"),
    ({"tokenizer": {"type": "sentencepiece"}},
     r"tokenizer\.type: must be one of word, bpe, unigram"),
])
def test_invalid_values_name_key_and_expectation(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_overrides_are_typed_and_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  layers: 6\n")
    cfg = load_config(path, ["train.lr=3e-4", "model.layers=4", "model.tie_embeddings=true"])
    assert cfg.train.lr == 3e-4 and cfg.model.layers == 4 and cfg.model.tie_embeddings is True
    with pytest.raises(ConfigError, match="unknown key 'layer'.*did you mean 'layers'"):
        load_config(path, ["model.layer=4"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        apply_overrides({}, ["model.layers"])


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(empty)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  layers: [1, 2\n")
    with pytest.raises(ConfigError, match=r"line \d+"):
        load_config(broken)


def test_data_paths_resolve_relative_to_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text("data:\n  source: tsv\n  path: ../pairs.tsv\n")
    assert load_config(path).data.path == str(tmp_path / "pairs.tsv")


def test_yaml_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="fix the YAML syntax|could not determine a constructor"):
        load_config(path)


def test_print_config_prints_the_documented_defaults_and_resolved_configs(tmp_path):
    from conftest import run_tmt

    defaults = run_tmt("train", "--print-config", cwd=tmp_path)
    assert defaults.returncode == 0, defaults.stderr
    assert defaults.stdout == documented_yaml()
    resolved = run_tmt("train", "--print-config", "--config", str(ROOT / "configs" / "tiny.yaml"),
                       "--set", "model.layers=3", cwd=tmp_path)
    assert resolved.returncode == 0, resolved.stderr
    cfg = config_from_dict(yaml.safe_load(resolved.stdout))
    assert cfg.name == "tiny" and cfg.model.layers == 3 and cfg.data.max_pairs == 3000
    assert not list(tmp_path.iterdir())        # printing creates no run folder
