import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The locally built byte-level BPE tokenizer carrying Qwen2.5's real chat template."""
    from agentrl.tiny_model import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from agentrl.tiny_model import build_model

    return build_model(tmp_path_factory.mktemp("tiny-model"))
