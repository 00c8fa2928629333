"""One module per ``dstl`` sub-command group. Each module defines ``register(app)``; the
CLI (``sparkplug.cli``) imports every module here, so sub-commands stay independent."""
