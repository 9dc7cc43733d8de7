"""Ctrl-C around a training step: deferred to the step's end once, at once the second time or
between steps; the previous handler comes back on close."""

import signal

import pytest

from rlver_jax.train.interrupts import StepGuard


def test_the_first_ctrl_c_waits_for_the_step_and_the_second_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    guard = StepGuard()
    try:
        guard.begin_step(3)
        signal.raise_signal(signal.SIGINT)  # deferred: the step goes on
        finished = True
        with pytest.raises(KeyboardInterrupt):
            guard.end_step()
        assert finished and not guard.torn

        with pytest.raises(KeyboardInterrupt):  # between steps: at once
            signal.raise_signal(signal.SIGINT)
        guard.close()
        assert signal.getsignal(signal.SIGINT) is before

        guard = StepGuard()
        guard.begin_step(4)
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # the second one: at once, and the step is torn
            signal.raise_signal(signal.SIGINT)
        assert guard.torn and guard.step == 4
    finally:
        guard.close()
    assert signal.getsignal(signal.SIGINT) is before
