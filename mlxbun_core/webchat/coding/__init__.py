"""Coding tools for the web chat agent: read, search, list, edit, write and run commands in
one workspace folder the user chose, every mutating or executing call behind an approval.

:mod:`.workspace` confines paths, :mod:`.files` and :mod:`.shell` do the work,
:mod:`.gate` holds one connection's state and its approval queue, :mod:`.frames` answers
``set_coding_tools`` and ``approval``.
"""
