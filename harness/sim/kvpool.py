"""A pool of fixed-size KV pages with prefix caching: blocks are reference counted, and a freed block
that carries a content hash stays cached (evictable, least recently freed first) until its pages are
needed, as vLLM's block pool does. The same class serves the GPU pool and the host pools."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

BlockKind = Literal["kv", "index", "hot"]


@dataclass(eq=False)
class Block:
    block_id: int
    pages: int
    kind: BlockKind
    content_hash: int | None = None
    ref_count: int = 0


class PagePool:
    """`capacity_pages` pages; every page is free, cached (evictable), held by a request, or hot."""

    def __init__(self, capacity_pages: int):
        self.capacity_pages = capacity_pages
        self.free_pages = capacity_pages       # not held and holding nothing worth keeping
        self.cached_pages = 0                  # freed blocks with a hash: free for allocation, reusable
        self.held_pages = 0                    # kv/index blocks held by requests
        self.hot_pages = 0                     # hot-buffer blocks (HiSparse)
        self._cached: OrderedDict[int, Block] = OrderedDict()   # block_id -> block, LRU first
        self._by_hash: dict[int, Block] = {}
        self._next_id = 0
        self.evictions = 0

    # ---------------------------------------------------------------- queries

    @property
    def available_pages(self) -> int:
        return self.free_pages + self.cached_pages

    @property
    def usage(self) -> float:
        """Fraction of pages held by requests (cached blocks count as free, as in vLLM)."""
        return (self.held_pages + self.hot_pages) / self.capacity_pages if self.capacity_pages else 0.0

    def lookup(self, content_hash: int) -> Block | None:
        return self._by_hash.get(content_hash)

    def longest_prefix(self, hashes: list[int]) -> list[Block]:
        found: list[Block] = []
        get = self._by_hash.get  # called per block of a prompt (thousands per request at long contexts)
        for h in hashes:
            block = get(h)
            if block is None:
                break
            found.append(block)
        return found

    def prefix_length(self, hashes: list[int]) -> int:
        """How many of `hashes`, from the first, the pool holds: the length of `longest_prefix`."""
        held = self._by_hash
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def conserved(self) -> bool:
        total = self.free_pages + self.cached_pages + self.held_pages + self.hot_pages
        return total == self.capacity_pages and min(self.free_pages, self.cached_pages,
                                                     self.held_pages, self.hot_pages) >= 0

    # ---------------------------------------------------------------- changes

    def can_allocate(self, pages: int) -> bool:
        return pages <= self.available_pages

    def allocate(self, count: int, pages_each: int, kind: BlockKind) -> list[Block] | None:
        """`count` new blocks, evicting cached blocks as needed; None (and no change) when they do not fit."""
        need = count * pages_each
        if need > self.available_pages:
            return None
        while self.free_pages < need:
            self._evict_one()
        self.free_pages -= need
        if kind == "hot":
            self.hot_pages += need
        else:
            self.held_pages += need
        blocks = []
        for _ in range(count):
            blocks.append(Block(self._next_id, pages_each, kind, None, 1))
            self._next_id += 1
        return blocks

    def acquire(self, block: Block) -> None:
        """Take a reference on a cached or shared block (a prefix hit)."""
        if block.ref_count == 0:
            del self._cached[block.block_id]
            self.cached_pages -= block.pages
            self.held_pages += block.pages
        block.ref_count += 1

    def set_hash(self, block: Block, content_hash: int) -> None:
        """The block is full and its content known: later requests with the same prefix may share it."""
        if block.content_hash is not None or content_hash in self._by_hash:
            return
        block.content_hash = content_hash
        self._by_hash[content_hash] = block

    def release(self, blocks: list[Block]) -> None:
        """Drop one reference on each; freed in reverse so a sequence's tail is evicted before its head."""
        for block in reversed(blocks):
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.kind == "hot":
                self.hot_pages -= block.pages
                self.free_pages += block.pages
            elif block.content_hash is not None:
                self.held_pages -= block.pages
                self.cached_pages += block.pages
                self._cached[block.block_id] = block
            else:
                self.held_pages -= block.pages
                self.free_pages += block.pages

    def _evict_one(self) -> None:
        _, block = self._cached.popitem(last=False)
        self.cached_pages -= block.pages
        self.free_pages += block.pages
        if block.content_hash is not None and self._by_hash.get(block.content_hash) is block:
            del self._by_hash[block.content_hash]
        block.content_hash = None
        self.evictions += 1
