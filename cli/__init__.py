"""The ``dstl`` command line: ``dstltree.cli.app`` and one module per command in
``dstltree.cli.commands``."""
