import os

import pytest

from anydraft.models import catalog


def require_model(name: str) -> str:
    """Skip when a catalog model is not installed, unless CI demands every model."""
    if not catalog.CATALOG[name].installed:
        if os.environ.get("ANYDRAFT_REQUIRE_MODELS") == "1":
            pytest.fail(f"{name} is not installed: run `anydraft models install {name}`")
        pytest.skip(f"{name} not installed (anydraft models install {name})")
    return name


@pytest.fixture(scope="session")
def real_model():
    """load_model with one instance per (name, dtype) for the whole test session."""
    from anydraft.models.loading import load_model

    cache = {}

    def get(name: str, dtype: str = "float32"):
        require_model(name)
        if (name, dtype) not in cache:
            cache[(name, dtype)] = load_model(name, dtype=dtype)
        return cache[(name, dtype)]

    return get


@pytest.fixture(scope="session")
def toys():
    """The toy target/drafter pair of tests/methods/toys.py, built once per session."""
    from tests.methods.toys import Toys

    return Toys()


def require_llamacpp() -> None:
    """Skip when llama-cpp-python is not installed, unless CI demands every model."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if os.environ.get("ANYDRAFT_REQUIRE_MODELS") == "1":
            pytest.fail("llama-cpp-python is not installed: pip install 'anydraft[llamacpp]'")
        pytest.skip("llama-cpp-python not installed (pip install 'anydraft[llamacpp]')")
