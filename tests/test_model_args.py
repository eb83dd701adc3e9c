"""pipeline/runtime/model_args.py's CancelWatch: how often LPX's python models ask Triton whether a
client has gone (each ask is a round trip through tritonserver). The real cancellation path, through
tritonserver and the gateway, is tested in test_triton_e2e.py, test_gateway.py and test_vllm_serving.py."""

from __future__ import annotations

import pytest

from pipeline.runtime import model_args
from pipeline.runtime.model_args import CANCEL_CHECK_S, CancelWatch


class Sender:
    """Triton's response sender as far as CancelWatch reads it: is_cancelled(), counted."""

    def __init__(self) -> None:
        self.asked, self.gone = 0, False

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.gone


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(model_args.time, "monotonic", lambda: now[0])
    return now


def test_asks_at_most_once_a_period_and_never_before_the_first_token(clock) -> None:
    sender = Sender()
    gone = CancelWatch(sender)
    assert gone() is False and sender.asked == 0  # the first token goes out without a round trip
    for _ in range(10):  # tokens within one period: no ask
        clock[0] += CANCEL_CHECK_S / 20
        assert gone() is False
    assert sender.asked == 0
    clock[0] += CANCEL_CHECK_S  # past the period: one ask
    assert gone() is False and sender.asked == 1
    assert gone() is False and sender.asked == 1  # and not again at once
    sender.gone = True
    clock[0] += CANCEL_CHECK_S / 2
    assert gone() is False and sender.asked == 1  # noticed at the next period, not before
    clock[0] += CANCEL_CHECK_S / 2
    assert gone() is True and sender.asked == 2
    clock[0] += 10 * CANCEL_CHECK_S
    assert gone() is True and sender.asked == 2  # cancelled stays cancelled, without asking


def test_a_sender_without_is_cancelled_is_never_cancelled(clock) -> None:
    gone = CancelWatch(object())
    assert gone() is False
    clock[0] += 2 * CANCEL_CHECK_S
    assert gone() is False
