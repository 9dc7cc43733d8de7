"""A full disk under the training writers (issue 44): TensorBoard's writer thread dying used to
print its traceback and then block the loop for good once tensorboardX's queue filled; now its
error is raised by the next write, one OSError naming the events directory, and nothing hangs."""

import errno
import threading

from tensorboardX import event_file_writer

from rlver_jax.train.metrics import Writers


def test_a_tensorboard_write_that_fails_is_raised_not_hung(tmp_path, monkeypatch, capfd):
    def full(self, event):
        raise OSError(errno.ENOSPC, "No space left on device")

    writers = Writers(tmp_path, start=0, total=50, progress=False)
    monkeypatch.setattr(event_file_writer.EventsWriter, "write_event", full)  # the disk fills
    raised: list[BaseException] = []

    def steps():
        try:
            for step in range(50):  # a step's ~60 scalars each: tensorboardX's queue of 10 filled at once
                writers.write(step, {f"m{k}": float(k) for k in range(60)})
                threading.Event().wait(0.05)  # the writer thread's turn
        except OSError as e:
            raised.append(e)

    loop = threading.Thread(target=steps, daemon=True)
    loop.start()
    loop.join(60)
    assert not loop.is_alive(), "the training loop hung on a dead TensorBoard writer"
    assert raised and raised[0].errno == errno.ENOSPC
    assert str(raised[0]) == f"[Errno 28] No space left on device: '{tmp_path / 'tensorboard'}'"
    assert "Traceback" not in capfd.readouterr().err
    closing = threading.Thread(target=writers.close, daemon=True)  # the writer thread is gone: nothing to wait for
    closing.start()
    closing.join(30)
    assert not closing.is_alive()
