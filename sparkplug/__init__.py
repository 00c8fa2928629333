"""Spark integration: the generic task runtime (``task.py``) running a ``KeyedJob``
(``keyed_job.py``) on a barrier stage, the driver side with restarts (``job.py``), the
keyed state backend, nodes beside executors, FLIP-27-style sources (``sources/``) and
the two-phase-commit file sink (``sinks/``)."""
