import threading

import numpy as np
import pytest

from prober.testbed.kvpool import PagePool, PoolExhausted

pytestmark = pytest.mark.unit


def test_recently_freed_pages_come_back_first_in_order_and_are_not_zeroed() -> None:
    pool = PagePool("p", num_tokens=64, page_size=4)
    first = pool.allocate(3, "a", timeout=1)
    pool.write(first, np.arange(1, 13, dtype=np.int32))
    pool.free(first, "a")
    again = pool.allocate(3, "b", timeout=1)
    assert again == first
    assert pool.read(again, 12).tolist() == list(range(1, 13))  # leftovers of "a"


def test_allocation_is_all_or_nothing_and_times_out() -> None:
    pool = PagePool("p", num_tokens=16, page_size=4)
    held = pool.allocate(3, "a", timeout=1)
    with pytest.raises(PoolExhausted):
        pool.allocate(2, "b", timeout=0.05)
    assert pool.usage().pages_used == 3
    pool.free(held, "a")
    pool.check_invariants()


def test_freeing_a_page_one_does_not_own_is_caught() -> None:
    pool = PagePool("p", num_tokens=16, page_size=4)
    pages = pool.allocate(1, "a", timeout=1)
    with pytest.raises(AssertionError):
        pool.free(pages, "b")


def test_invariants_hold_under_concurrent_allocation() -> None:
    pool = PagePool("p", num_tokens=4096, page_size=16)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            for i in range(200):
                pages = pool.allocate(1 + (i * 7) % 40, name, timeout=5)
                pool.write(pages, np.full(len(pages) * 16, hash(name) & 0xFFFF, dtype=np.int32))
                assert set(pool.read(pages, len(pages) * 16).tolist()) == {hash(name) & 0xFFFF}
                pool.free(pages, name)
        except BaseException as exc:  # collected, asserted in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool.check_invariants()
    assert pool.usage().pages_used == 0
