"""Session-wide random-weight models (built once, read-only: copy a folder before editing it).

Building one needs transformers and PyTorch: without them, every test that asks for a model is
skipped (hf_models skips on import) and the other tests of tests/graph still run.
"""

import pytest


def _models():
    import hf_models

    hf_models.torch.set_num_threads(2)
    return hf_models


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    return _models().make_gpt2(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """Grouped-query attention (4 heads, 2 KV heads), untied LM head."""
    return _models().make_llama(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def llama_tied_dir(tmp_path_factory):
    return _models().make_llama(tmp_path_factory.mktemp("hf"), hidden=64, tie=True,
                                rope_theta=500000.0, seed=1)


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory):
    return _models().make_bert(tmp_path_factory.mktemp("hf"))
