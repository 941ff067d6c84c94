"""Framework adapters: ``hmgstore.plugins.pyg`` and ``hmgstore.plugins.dgl``.

Adapters translate the frameworks' calls into :func:`hmgstore.gather_many`;
they never gather themselves.
"""
