"""The storage boundary, below the client: one format-agnostic store over fsspec URLs
(``store.py``: errors translated at the boundary, retries), the storage errors
(``errors.py``), hedged uploads (``hedging.py``), the fault-injecting filesystem
(``faults.py``, fsspec protocol ``faulty`` through the ``fsspec.specs`` entry point) and
where a job's storage is (``targets.py``).

Nothing here imports ``dstltree.client``, ``aggregator``, ``coordinator`` or
``sparkplug``, and nothing here reads what is inside an object: the object format and
its readers are the client's (``client/objectformat.py``, ``client/reader.py``).
"""
