"""Session protocol: incremental feeding and rollback reproduce a full forward pass."""

import pytest
import torch

from anydraft.models.session import HFSession
from tests.helpers import tiny_llama

# float32 on CPU: different batch shapes reorder reductions; 1e-3 absolute on logits is far
# below anything that moves an argmax or a probability by more than ~1e-3 relative.
ATOL = 1e-3


def full_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def check_session(model, ids, chunks, rollbacks):
    reference = full_logits(model, ids)
    session = HFSession(model)
    pos = 0
    for size in chunks:
        got = session.feed(ids[pos : pos + size])
        torch.testing.assert_close(got, reference[pos : pos + size], atol=ATOL, rtol=0)
        pos += size
    assert len(session) == len(ids)
    # rows=1 returns only the last row
    session.rollback(len(ids) - 3)
    torch.testing.assert_close(session.feed(ids[-3:], rows=1), reference[-1:], atol=ATOL, rtol=0)
    for keep in rollbacks:
        session.rollback(keep)
        assert len(session) == keep
        got = session.feed(ids[keep:])
        torch.testing.assert_close(got, reference[keep:], atol=ATOL, rtol=0)


def test_tiny_model_one_by_one_equals_all_at_once():
    model = tiny_llama(300)
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    check_session(model, ids, chunks=[5] + [1] * 10 + [7, 18], rollbacks=[0, 39, 20, 1])


REAL = {"smollm2-135m": 80, "qwen2.5-coder-0.5b": 60, "qwen2.5-coder-1.5b": 40}


@pytest.mark.real
@pytest.mark.parametrize("name", list(REAL))
def test_real_session_feed_and_rollback(real_model, name):
    model = real_model(name)
    n = REAL[name]
    ids = torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(2)).tolist()
    check_session(model, ids, chunks=[n // 2] + [1] * 6 + [n - n // 2 - 6], rollbacks=[n // 2, n - 5, 3])


@pytest.mark.real
def test_gemma_rollback_across_sliding_window(real_model):
    """Gemma-3 layers attend to a 512-token window; roll back just after passing it."""
    model = real_model("gemma3-270m")
    window = model.config.sliding_window
    n = window + 24
    ids = torch.randint(300, 200000, (n,), generator=torch.Generator().manual_seed(3)).tolist()
    check_session(model, ids, chunks=[window - 4] + [1] * 8 + [20],
                  rollbacks=[window + 2, window - 2, window + 10, window])
