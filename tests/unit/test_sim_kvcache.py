"""Block pool and prefix cache of the simulator (pure)."""

import pytest

from llmplane.sim.kvcache import BlockPool, block_hash, chain_hashes


def test_chain_hashes_cover_full_blocks_and_depend_on_the_prefix():
    a = chain_hashes(list(range(40)), 16)
    assert len(a) == 2  # 8 trailing tokens do not make a block
    b = chain_hashes([99, *range(1, 40)], 16)
    assert a[0] != b[0] and a[1] != b[1]  # a change in block 0 changes every later hash
    assert chain_hashes(list(range(40)), 16, seed=7)[0] != a[0]  # extra key (LoRA)
    assert a[1] == block_hash(a[0], list(range(16, 32)))


def test_allocate_release_and_usage():
    pool = BlockPool(8, 4)
    blocks = pool.allocate(3)
    assert pool.num_used == 3 and pool.usage() == pytest.approx(3 / 8)
    pool.release(blocks)
    assert pool.num_used == 0 and pool.num_free == 8
    with pytest.raises(RuntimeError):
        pool.allocate(9)


def test_cached_blocks_survive_release_and_are_found_again():
    pool = BlockPool(8, 4)
    hashes = chain_hashes(list(range(12)), 4)
    blocks = pool.allocate(3)
    for b, h in zip(blocks, hashes, strict=True):
        pool.register(b, h)
    pool.release(blocks)
    assert pool.lookup(hashes, 10) == blocks
    assert pool.lookup(hashes, 2) == blocks[:2]
    # a miss in the middle stops the match
    assert pool.lookup([hashes[0], 12345, hashes[2]], 10) == blocks[:1]
    pool.touch(blocks[:2])
    assert pool.ref[blocks[0]] == 1 and pool.num_free == 6


def test_lru_eviction_reuses_oldest_free_blocks_and_tail_first():
    pool = BlockPool(4, 2)
    hashes = chain_hashes(list(range(8)), 2)
    blocks = pool.allocate(4)
    for b, h in zip(blocks, hashes, strict=True):
        pool.register(b, h)
    pool.release(blocks)  # freed tail first: the prefix's last block is evicted first
    fresh = pool.allocate(1)
    assert fresh == [blocks[3]]
    assert pool.lookup(hashes, 4) == blocks[:3]
    fresh += pool.allocate(1)
    assert pool.lookup(hashes, 4) == blocks[:2]


def test_touching_a_cached_block_protects_it_from_eviction():
    pool = BlockPool(2, 2)
    h = chain_hashes([1, 2], 2)
    (b,) = pool.allocate(1)
    pool.register(b, h[0])
    pool.release([b])
    pool.touch([b])
    other = pool.allocate(1)
    assert other != [b] and pool.lookup(h, 1) == [b]
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_disabled_caching_never_hits():
    pool = BlockPool(4, 2, enable_caching=False)
    h = chain_hashes([1, 2], 2)
    (b,) = pool.allocate(1)
    pool.register(b, h[0])
    pool.release([b])
    assert pool.lookup(h, 1) == []
