"""Host memory: tables pinned for zero-copy reads (:mod:`.pinned`), memory hmgstore allocates
(cudaHostAlloc or huge pages, :mod:`.owned`), segments shared by the processes of a node (:mod:`.shared`) and
arrays over memory-mapped files, checked whole before they are read (:mod:`.mapped`)."""
from . import owned
from .pinned import PinnedHost, as_host_tensor, extent, private_anonymous_bytes, registered_ranges, row_layout
from .shared import (
    SEGMENT_PREFIX,
    attach_segment,
    create_segment,
    process_alive,
    segment_dir,
    sweep_stale_segments,
    unlink_segment,
)

__all__ = ["owned", "PinnedHost", "as_host_tensor", "extent", "private_anonymous_bytes", "registered_ranges",
           "row_layout", "SEGMENT_PREFIX", "attach_segment", "create_segment", "process_alive", "segment_dir",
           "sweep_stale_segments", "unlink_segment"]
