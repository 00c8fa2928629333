"""``python -m dstltree.cli``: the same as ``dstl``."""

from dstltree.cli.app import app

app()
