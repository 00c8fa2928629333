"""Spark integration: nodes beside executors, the keyed state backend, the stateful job,
the main job and the ``dstl`` command line."""
