"""A gs:// work directory: files are staged locally and mirrored to the bucket, each new or changed
file once; a resumed run fetches what it needs. The bucket is fsspec's in-memory file system
registered for gs:// (etils.epath reaches gs:// through fsspec)."""

import fsspec
import pytest
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import _registry as fsspec_registry

from rlver_jax.train import checkpoint
from rlver_jax.train.workdir import WorkDir, is_url


class _Recording(dict):
    """The bucket's objects, recording every upload."""

    uploads: list = []

    def __setitem__(self, key, value):
        self.uploads.append(key)
        super().__setitem__(key, value)


class FakeBucket(MemoryFileSystem):
    protocol = ("gs", "gcs")
    store = _Recording()  # its own, apart from memory://
    pseudo_dirs = [""]

    def __init__(self, *args, finalize_on_close=None, **kwargs):  # gcsfs's keyword, as epath passes it
        super().__init__(*args, **kwargs)


@pytest.fixture
def bucket():
    for name in ("gs", "gcs"):
        fsspec.register_implementation(name, FakeBucket, clobber=True)
    FakeBucket.store.clear()
    FakeBucket.store.uploads.clear()
    yield FakeBucket.store, FakeBucket.store.uploads
    FakeBucket.store.clear()
    for name in ("gs", "gcs"):  # later tests get the real gs:// again (gcsfs, when installed)
        fsspec_registry.pop(name, None)
    epath.backend.fsspec_backend._get_filesystem.cache_clear()


def _read(store, path: str) -> bytes:
    (value,) = [v for k, v in store.items() if k.endswith(path)]
    return value.getvalue()


def test_local_work_dir_is_the_directory(tmp_path):
    w = WorkDir(str(tmp_path / "run"))
    assert w.remote is None and w.local == tmp_path / "run" and w.local.is_dir()
    assert w.checkpoints == str(tmp_path / "run" / "checkpoints")
    w.push()  # nothing to mirror
    assert not is_url(tmp_path) and is_url("gs://b/run")


def test_a_failed_start_removes_only_a_directory_it_made(tmp_path):
    """WorkDir.remove_if_new: a directory this start made goes with what the start wrote (the lock
    kept aside); one that was there before, or that holds anything else, stays as it is."""
    made = WorkDir(tmp_path / "new" / "run")
    (made.local / "tokenizer").mkdir()
    (made.local / "tokenizer" / "vocab.json").write_text("{}")
    (made.local / "config.json").write_text("{}")
    made.remove_if_new(("tokenizer", "config.json"))
    assert not made.local.exists() and (tmp_path / "new").is_dir()

    other = WorkDir(tmp_path / "other")
    (other.local / "config.json").write_text("{}")
    (other.local / "notes.txt").write_text("mine")
    other.remove_if_new(("tokenizer", "config.json"))
    assert sorted(p.name for p in other.local.iterdir()) == ["config.json", "notes.txt"]

    (tmp_path / "before").mkdir()
    before = WorkDir(tmp_path / "before")
    (before.local / "config.json").write_text("{}")
    before.remove_if_new(("config.json",))
    assert not before.created and (before.local / "config.json").exists()


def test_gs_work_dir_mirrors_new_and_changed_files_once(bucket):
    store, _ = bucket
    w = WorkDir("gs://bucket/run")
    assert w.checkpoints == "gs://bucket/run/checkpoints" and w.local.is_dir()
    (w.local / "transcripts").mkdir()
    (w.local / "transcripts" / "train_000000.jsonl").write_text('{"a": 1}\n')
    (w.local / "metrics.jsonl").write_text('{"step": 0}\n')
    w.push()
    assert _read(store, "run/transcripts/train_000000.jsonl") == b'{"a": 1}\n'
    uploaded = len(store)
    (w.local / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    w.push()
    assert len(store) == uploaded and _read(store, "run/metrics.jsonl").count(b"step") == 2

    resumed = WorkDir("gs://bucket/run")  # another machine: an empty staging directory
    resumed.pull("metrics.jsonl", "missing.png")
    assert (resumed.local / "metrics.jsonl").read_text().count("step") == 2
    assert not (resumed.local / "missing.png").exists()


def test_push_uploads_only_what_changed(bucket):
    store, uploads = bucket
    w = WorkDir("gs://bucket/run2")
    (w.local / "a.txt").write_text("1")
    (w.local / "b.txt").write_text("2")
    w.push()
    first = len(uploads)
    (w.local / "b.txt").write_text("22")
    w.push()
    assert first >= 2 and len(uploads) == first + 1 and uploads[-1].endswith("run2/b.txt")


def test_checkpoint_manager_keeps_urls():
    assert checkpoint._location("gs://bucket/run/checkpoints") == "gs://bucket/run/checkpoints"
    assert checkpoint._location("rel/dir").startswith("/")
