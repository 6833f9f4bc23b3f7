import os

import pytest

from anydraft.atomic import cache_dir
from anydraft.models import catalog

# What tests share with the real cache: the catalog's model files and what is made from them
# alone (transformers conversions, quantized copies, the llama-server build), named by what they
# come from, the same whoever makes them, and minutes to make again. What a run measures or decides (cost curves,
# scout winners) goes to the session's own cache instead: tests leave nothing in the user's
# profiles and never read what an earlier run measured.
SHARED_WITH_REAL_CACHE = ("models", "converted", "quantized", "llama-server")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """``$ANYDRAFT_CACHE`` for the whole session: a temporary directory whose
    `SHARED_WITH_REAL_CACHE` folders are links to the real cache's. Yields (this cache, the
    real one). A test about the real cache sets ``ANYDRAFT_CACHE`` itself."""
    real = cache_dir()
    cache = tmp_path_factory.mktemp("anydraft-cache")
    for name in SHARED_WITH_REAL_CACHE:
        (real / name).mkdir(parents=True, exist_ok=True)  # a link must point at a folder
        (cache / name).symlink_to(real / name, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANYDRAFT_CACHE", str(cache))
        yield cache, real


@pytest.fixture
def started_with_hugepages(monkeypatch):
    """``start(on)``: `this_machine` reads huge pages ``on`` from then on, as a process started
    with the tunable (the `anydraft` command restarts itself with it) or without would."""
    from anydraft.hardware import machine

    def start(on: bool) -> None:
        monkeypatch.setattr(machine, "hugepages_state", lambda: (on, "set by a test"))
        machine.this_machine.cache_clear()

    yield start
    machine.this_machine.cache_clear()  # before monkeypatch undoes: the next reads the real state


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


def require_llamacpp(engine: str = "llamacpp") -> None:
    """Skip when the llama.cpp-family ``engine`` (models/engines.py: llamacpp, ik) is not
    installed, unless CI demands every model."""
    from anydraft.models.engines import ENGINES

    if not ENGINES[engine].installed():
        if os.environ.get("ANYDRAFT_REQUIRE_MODELS") == "1":
            pytest.fail(f"{ENGINES[engine].install}")
        pytest.skip(f"{engine} not installed ({ENGINES[engine].install})")
