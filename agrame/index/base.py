"""The small interface every index backend implements (PyLate's ``indexes/base.py`` in spirit):
the local folder (:class:`agrame.index.Index`) today; sharded and Ray-backed indexes implement
the same five operations, so front ends (CLI, HTTP, integrations) never depend on the backend."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, List, Mapping, Optional, Sequence


class PassageCount(int):
    """A count of live passages that says whether it is whole: ``missing_shards`` names the shards
    whose passages it could not count (``partial`` then), so a degraded sharded index never passes a
    part for the whole. ``len()`` of such an index raises instead (Python's ``len`` keeps no flag)."""

    missing_shards: List[int]

    def __new__(cls, value: int, missing_shards: Sequence[int] = ()) -> "PassageCount":
        count = super().__new__(cls, value)
        count.missing_shards = sorted(missing_shards)
        return count

    @property
    def partial(self) -> bool:
        return bool(self.missing_shards)


class BaseIndex(ABC):
    """add / upsert / delete / get / search by the user's own passage ids."""

    @abstractmethod
    def add(self, passages: Iterable, **options) -> dict:
        """Add passages with new ids (an id the index holds is an error); returns the commit's manifest."""

    @abstractmethod
    def upsert(self, passages: Iterable, **options) -> dict:
        """Replace passages whose ids exist, add the rest, in one commit."""

    @abstractmethod
    def delete(self, ids: Sequence[str], *, missing: str = "error", **options) -> dict:
        """Delete passages by id (unknown ids are an error unless ``missing="ok"``)."""

    @abstractmethod
    def get(self, passage_id: str) -> Optional[dict]:
        """``{"id", "text", "metadata"}`` of a live passage, or None."""

    @abstractmethod
    def search(self, query: str, granularity: str = "sentence", top_k: Optional[int] = 10, *,
               filter: Optional[Mapping[str, Any]] = None, **options) -> List:
        """Ranked hits (passages, sentences or spans), best first, restricted by a metadata filter."""

    def with_metadata(self, hits: List) -> List:
        """``hits`` (in place) each with its passage's metadata (``{}`` when none), one lookup an id — the
        shape every interface's hits share (issue 63); hits that carry theirs already are left as they are."""
        found: dict = {}
        for k, h in enumerate(hits):
            if getattr(h, "metadata", {}) is None:
                if h.passage_id not in found:
                    found[h.passage_id] = dict(self.metadata(h.passage_id) or {})
                hits[k] = h._replace(metadata=found[h.passage_id])
        return hits

    def metadata(self, passage_id: str) -> dict:
        """The metadata of a live passage (``{}`` when it has none)."""
        record = self.get(passage_id)
        return {} if record is None else dict(record.get("metadata") or {})

    @abstractmethod
    def __len__(self) -> int:
        """Live passages (every shard's: an index with shards down raises rather than undercount)."""

    def count(self, *, allow_partial: bool = False) -> PassageCount:
        """Live passages; with ``allow_partial`` the shards that answer, the others named in it."""
        return PassageCount(len(self))

    def check_unchanged(self) -> None:
        """Raise :class:`~agrame.index.format.IndexDamagedError` naming a committed file that no longer
        holds what was committed (a running server calls it before each read); cheap when nothing
        changed. A backend whose parts check themselves does nothing here."""

    def unavailable(self, timeout: Optional[float] = None) -> List[dict]:
        """The shards that do not answer now, one ``{"shard", "since", "reason", "permanent"}`` each
        (``since``: Unix time of the first failure seen; ``permanent``: it will not come back by
        itself) — empty when every part answers, as always for a local folder."""
        return []
