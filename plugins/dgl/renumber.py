"""Which attached edge features ``remove_nodes``/``remove_edges`` renumbered: each edge's id carried through.

:class:`~hmgstore.plugins.dgl.HybridDGLGraph` tags each attached edge type's
frame with its edge ids before a removal (:func:`tag_edges`), lets DGL reindex
that column as it reindexes ``g.edata``, reads whether any id moved
(:func:`edges_moved`) and drops the column (:func:`untag_edges`).
"""
from __future__ import annotations

import torch

#: A column DGL carries through ``remove_nodes``/``remove_edges`` for us: each edge's id before the call.
EDGE_ID_TAG = "_hmgstore_edge_id_before"


def tag_edges(graph, edge_types: list) -> list | None:
    """Put each attached edge type's edge ids in a column of its frame, which the removal then reindexes as it
    reindexes ``g.edata``; the tagged frames, or None when no edge feature is attached. The edge count alone
    does not tell whether ids moved: ``remove_nodes`` (of an isolated node, too) rebuilds the edges from a CSR
    or CSC, which can reorder the ids of the edges left at the same count. The tagged frames are shallow
    copies (no tensor copied) in a new list, so that graphs sharing the old ones (``copy.copy``) never see
    the column."""
    if not edge_types:
        return None
    graph._edge_frames = [frame.clone() for frame in graph._edge_frames]
    for etype in edge_types:
        graph._edge_frames[graph.get_etype_id(etype)][EDGE_ID_TAG] = torch.arange(
            graph.num_edges(etype), dtype=torch.int64, device=graph.device)
    return graph._edge_frames


def edges_moved(graph, etype, count: int) -> str | None:
    """None when no edge of ``etype`` was removed and each kept its id; otherwise what the stale message adds
    (a note when the count stayed and only the ids moved)."""
    before = graph._edge_frames[graph.get_etype_id(etype)][EDGE_ID_TAG]
    if len(before) != count:
        return ""
    if torch.equal(before, torch.arange(count, dtype=before.dtype, device=before.device)):
        return None
    return " (as many edges as before, under other ids)"


def untag_edges(graph, frames: list, tagged: list | None) -> None:
    """Drop the tag column :func:`tag_edges` added: the old frames back where the removal did not replace
    them (it removed nothing, or failed), else the column taken out of the frames it left."""
    if tagged is None:
        return
    if graph._edge_frames is tagged:
        graph._edge_frames = frames
        return
    for frame in graph._edge_frames:
        if EDGE_ID_TAG in frame.keys():
            del frame[EDGE_ID_TAG]
