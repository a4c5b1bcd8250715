"""Session-wide random-weight models (built once, read-only: copy a folder before editing it)."""

import pytest
import torch
from hf_models import make_bert, make_gpt2, make_llama

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    return make_gpt2(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """Grouped-query attention (4 heads, 2 KV heads), untied LM head."""
    return make_llama(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def llama_tied_dir(tmp_path_factory):
    return make_llama(tmp_path_factory.mktemp("hf"), hidden=64, tie=True, rope_theta=500000.0,
                      seed=1)


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory):
    return make_bert(tmp_path_factory.mktemp("hf"))
