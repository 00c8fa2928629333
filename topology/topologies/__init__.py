"""The topologies shipped with the package (data only; topology/catalog.py names them)."""
