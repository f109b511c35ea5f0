"""The adapter read's hash on a thread of its own (adapters/chunk_hasher.py): the same digest
as hashing in line, chunks in their order, a failure handed to the reader, no thread left
behind, and in line where the read is paced."""

import hashlib
import threading

import pytest

from loragate.adapters import loader
from loragate.adapters.chunk_hasher import ChunkHasher
from loragate.adapters.loader import hashed_read
from loragate.adapters.pacing import CHUNK_BYTES, UNPACED, LoadPacing


def _chunks(count: int) -> list[bytes]:
    return [bytes([i]) * (3000 + 17 * i) for i in range(count)]


@pytest.mark.parametrize("threaded", [False, True])
def test_the_digest_is_the_chunks_in_their_order(threaded):
    chunks = _chunks(40)
    hasher = ChunkHasher(threaded)
    for chunk in chunks:
        hasher.update(memoryview(chunk))
    assert hasher.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
    reordered = ChunkHasher(threaded)
    for chunk in reversed(chunks):
        reordered.update(memoryview(chunk))
    assert reordered.hexdigest() != hashlib.sha256(b"".join(chunks)).hexdigest()


def test_a_chunk_the_thread_cannot_hash_fails_the_digest():
    hasher = ChunkHasher(threaded=True)
    hasher.update(memoryview(b"fine"))
    hasher.update("not bytes")  # hashlib refuses a str: TypeError on the thread
    with pytest.raises(TypeError):
        hasher.hexdigest()
    assert not _hash_threads()


def _hash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "loragate-adapter-hash"]


def _big_file(tmp_path, size=3 * CHUNK_BYTES + 11):
    path = tmp_path / "weights"
    content = bytes((i * 13) % 251 for i in range(size))
    path.write_bytes(content)
    return path, content


class _Recording(ChunkHasher):
    made: list["_Recording"] = []

    def __init__(self, threaded: bool):
        super().__init__(threaded)
        self.threaded = threaded
        self.seen_thread = False
        _Recording.made.append(self)

    def update(self, chunk):
        self.seen_thread |= bool(_hash_threads())
        super().update(chunk)


def test_an_unpaced_read_hashes_on_the_thread_while_reading(tmp_path, monkeypatch):
    path, content = _big_file(tmp_path)
    _Recording.made = []
    monkeypatch.setattr(loader, "ChunkHasher", _Recording)
    data, digest = hashed_read(path, UNPACED)
    assert bytes(data) == content and digest == hashlib.sha256(content).hexdigest()
    (hasher,) = _Recording.made
    assert hasher.threaded and hasher.seen_thread
    assert not _hash_threads()


def test_a_paced_read_hashes_in_line(tmp_path, monkeypatch):
    path, content = _big_file(tmp_path)
    _Recording.made = []
    monkeypatch.setattr(loader, "ChunkHasher", _Recording)
    paced = LoadPacing(busy=lambda: True, sleep=lambda seconds: None)
    data, digest = hashed_read(path, paced)
    assert digest == hashlib.sha256(content).hexdigest()
    (hasher,) = _Recording.made
    assert not hasher.threaded and not hasher.seen_thread


def test_a_read_that_fails_leaves_no_hash_thread(tmp_path, monkeypatch):
    path, _ = _big_file(tmp_path)
    real_open = open

    class Breaking:
        def __init__(self, file):
            self.file, self.reads = file, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def fileno(self):
            return self.file.fileno()

        def readinto(self, view):
            self.reads += 1
            if self.reads == 2:
                raise OSError("disk gone")
            return self.file.readinto(view)

    monkeypatch.setattr(loader, "open", lambda p, mode: Breaking(real_open(p, mode)), raising=False)
    with pytest.raises(OSError, match="disk gone"):
        hashed_read(path, UNPACED)
    assert not _hash_threads()
