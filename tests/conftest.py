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
    """load_model with one instance per (name, dtype, device) for the whole test session."""
    from anydraft.models.loading import load_model

    cache = {}

    def get(name: str, dtype: str = "float32", device: str = "cpu"):
        require_model(name)
        if (name, dtype, device) not in cache:
            cache[(name, dtype, device)] = load_model(name, dtype=dtype, device=device)
        return cache[(name, dtype, device)]

    return get


@pytest.fixture(scope="session")
def exactness_device() -> str:
    """Where the real-model greedy exactness tests run their torch models: the environment's
    ANYDRAFT_TEST_DEVICE (cpu, cuda or auto; default cpu), as scripts/gpu_check.sh sets it.
    llama.cpp models stay on the CPU."""
    from anydraft.models.loading import resolve_device

    return resolve_device(os.environ.get("ANYDRAFT_TEST_DEVICE", "cpu"))


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
