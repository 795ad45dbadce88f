"""``DefaultStore``: one store per process and Kv, swapped with ``use``, rebuilt after ``use_kv`` and ``fork``."""

from __future__ import annotations

import os
import threading

from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import DefaultStore, default_kv, use_kv


class _Store:
    def __init__(self, kv: object) -> None:
        self.kv = kv
        self.pid = os.getpid()


def test_one_store_per_kv_built_once_under_concurrency() -> None:
    built: list[_Store] = []

    def build(kv: object) -> _Store:
        built.append(_Store(kv))
        return built[-1]

    stores = DefaultStore(build)
    first, second = MemoryKv(), MemoryKv()
    with use_kv(first):
        start = threading.Barrier(8)
        seen: list[_Store] = []

        def worker() -> None:
            start.wait()
            seen.append(stores.get())

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert len(seen) == 8 and {id(s) for s in seen} == {id(built[0])}
        assert built[0].kv is first and default_kv() is first
        with use_kv(second):
            assert stores.get().kv is second  # another Kv: another store
        assert stores.get().kv is first and len(built) == 3  # and back: built again for it
        override = _Store(None)
        with stores.use(override):
            assert stores.get() is override
        before = stores.get()
        stores.reset()
        assert stores.get() is not before


def test_a_forked_child_builds_its_own_store() -> None:
    stores = DefaultStore(_Store)
    with use_kv(MemoryKv()):
        parent = stores.get()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                child = stores.get()
                ok = child is not parent and child.pid == os.getpid() and stores.get() is child
                os.write(write, b"ok" if ok else b"shared")
            finally:
                os._exit(0)
        os.close(write)
        try:
            answer = os.read(read, 16)
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        assert answer == b"ok"
        assert stores.get() is parent
