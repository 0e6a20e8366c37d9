"""What the catalog tells the router about adapters: sources, sizes, pools and classes.

Built by ``router.wiring.adapter_info_from_catalog`` from a catalog (again when the
catalog file changes, ``Router.use_adapters``); the router reads it, never the catalog.
Holds values only: no IO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from placement.domain import AdapterId, PoolId


@dataclass(frozen=True, kw_only=True)
class AdapterInfo:
    """What the catalog tells the router about adapters: where to load them from, sizes."""

    sources: Mapping[AdapterId, str] = field(default_factory=dict)
    size_bytes: Mapping[AdapterId, int] = field(default_factory=dict)
    #: Pool of each adapter's base model, for adapters the plan does not place.
    pools: Mapping[AdapterId, PoolId] = field(default_factory=dict)
    #: The source of an adapter the catalog lacks (``adapter_source_template``), or
    #: None when none can be made for it; None: such adapters are unknown.
    resolve: Callable[[AdapterId], str | None] | None = None
    #: Each adapter's catalog class weight (``AdapterClass.weight``: production 1.0,
    #: batch 0.5, experiment 0.1); the picker keeps them apart only under
    #: ``RouterSettings.class_priority``. An adapter absent counts as production.
    classes: Mapping[AdapterId, float] = field(default_factory=dict)

    def source_of(self, adapter: AdapterId) -> str | None:
        """Where to load ``adapter`` from: the catalog's source, else the template's."""
        source = self.sources.get(adapter)
        if source is None and self.resolve is not None:
            return self.resolve(adapter)
        return source
