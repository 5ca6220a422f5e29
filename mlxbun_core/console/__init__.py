"""The terminal side of the ``mlxbun`` command beyond serving: ``--version``, ``help VERB``,
bare ``mlxbun`` as ``serve``, quiet exits into a closed pipe, and ``mlxbun chat`` (a
terminal chat against a server it finds or starts)."""
