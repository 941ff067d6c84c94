"""Changing what a :class:`~hmgstore.plugins.pyg.HybridFeatureStore` holds without losing what it held.

PyG's default ``FeatureStore.update_tensor`` removes the attribute, then puts
the new tensor: when the put fails (a partial index, a row count that differs
from the node type's other attributes, a dtype tables cannot hold) the
attribute is gone. The store's ``update_tensor`` instead changes nothing
unless the new value is accepted:

- ``index`` None (or ``slice(None)``): the new table is built and checked
  against the node type's other attributes first, and replaces the old one
  only then (:meth:`HybridFeatureStore._put_tensor`).
- any other ``index``: the rows are written into the table in place
  (``table[index] = rows``: the host tier, which is the caller's memory unless
  the table was built with ``copy=True`` or a stored format, and the GPU
  tier's copies). The table checks ids, shape and dtype before it writes a
  row, so a refused write leaves every row as it was.

``remove_tensor`` removes whole attributes only: a table has one row per node,
so rows cannot be taken out of it.
"""
from __future__ import annotations

from torch_geometric.data import TensorAttr

from hmgstore import HybridTensor
from hmgstore.rows import checks

_UNSET = TensorAttr().index  # PyG's marker of a field not given


class IndexAttr(TensorAttr):
    """PyG's ``TensorAttr``, whose ``index`` may also be a numpy array, as PyG's ``IndexType`` allows: PyG's own
    ``is_set`` compares a field with ``!=``, which a numpy array answers element by element, so that
    ``store.get_tensor(None, "x", np.array([...]))`` raised ValueError ("truth value of an array") inside PyG."""

    @classmethod
    def cast(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and type(args[0]) is TensorAttr:  # PyG's own, built by the caller
            attr = args[0]
            return cls(attr.group_name, attr.attr_name, attr.index)
        return super().cast(*args, **kwargs)

    def is_set(self, key: str) -> bool:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"TensorAttr has no field {key!r}; its fields: {list(self.__dataclass_fields__)}")
        return getattr(self, key) is not _UNSET


def is_whole(index) -> bool:
    """Whether ``index`` names every row of a table: None or ``slice(None)``."""
    return index is None or (isinstance(index, slice) and index == slice(None))


def index_none_by_default(args: tuple, kwargs: dict, call: str) -> dict:
    """``kwargs`` with ``index=None`` added when ``args``/``kwargs`` (``TensorAttr`` fields after the tensor)
    leave the index out, so that ``put_tensor(x, group, name)`` and ``update_tensor`` mean the whole table.
    Raises TypeError naming the store's method ``call`` for a keyword that is not a field (the closest one)."""
    checks.keywords(f"HybridFeatureStore.{call}", kwargs, checks.takes(TensorAttr))
    if len(args) < 3 and not (args and isinstance(args[0], TensorAttr)) and "index" not in kwargs:
        return {**kwargs, "index": None}
    return kwargs


def check_specified(attr: TensorAttr, call: str) -> None:
    """Raise ValueError naming the fields of ``attr`` that ``call`` still needs, and how to give them."""
    if not attr.is_fully_specified():
        unset = [name for name in attr.__dataclass_fields__ if not attr.is_set(name)]
        raise ValueError(f"{call} needs group_name, attr_name and index (None: the whole table); {unset} not "
                         f"given in {attr}: pass them, e.g. {call}(tensor, group_name=None, attr_name='x', index=None)")


def update(store, tensor, attr: TensorAttr) -> bool:
    """``store.update_tensor(tensor, attr)``: change attribute ``attr`` of ``store`` or raise with it unchanged.

    Args:
        store: a :class:`~hmgstore.plugins.pyg.HybridFeatureStore`.
        tensor: ``index`` None (or ``slice(None)``): the new whole table, anything ``put_tensor`` takes (a
            host tensor, array or memmap, or a HybridTensor on the store's device), built and checked before
            it replaces the old one (a host source gets no GPU rows, as with ``put_tensor``: pass a
            HybridTensor to place some).
            Another index: rows broadcasting to ``[len(index), *row_shape]`` whose values the table's dtype
            holds, written in place (``table[index] = tensor``).
        attr: the fully specified ``TensorAttr`` (``index`` given).

    Returns:
        True.

    Raises:
        ValueError: ``attr`` not fully specified; and what ``put_tensor`` raises for a whole table (a row
            count that differs from the node type's other attributes, a table on another device).
        TypeError: rows of a table over read-only memory (a memmap opened with ``mode="r"``), with the two
            ways to change it; a dtype tables cannot hold (uint16) or values of another kind.
        KeyError: rows of an attribute the store lacks. IndexError: ids out of range (before any write).
    """
    check_specified(attr, "update_tensor")
    if is_whole(attr.index):
        return store._put_tensor(tensor, attr)  # builds the new table, then swaps it in: nothing removed first
    table: HybridTensor = store.table(attr.group_name, attr.attr_name)
    if table.read_only:
        raise TypeError(f"update_tensor with an index writes rows of ({attr.group_name!r}, {attr.attr_name!r}) "
                        "in place, and its table is over read-only memory (e.g. a memmap opened with mode='r'); "
                        "update the whole attribute (index=None) with a writable tensor, or build the store "
                        "with copy=True")
    table[attr.index] = tensor  # the table checks ids, shape and values before it writes a row
    return True


def check_removable(attr: TensorAttr) -> None:
    """Raise ValueError unless ``attr`` names a whole attribute (``index`` None or ``slice(None)``)."""
    if not is_whole(attr.index):
        raise ValueError(f"rows cannot be removed from a table, only the whole attribute: call "
                         f"remove_tensor({attr.group_name!r}, {attr.attr_name!r}, index=None) (got an index of "
                         f"{type(attr.index).__name__}); nothing was removed")
