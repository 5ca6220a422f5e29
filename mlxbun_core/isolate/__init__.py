"""Crash isolation: the engine runs as a child process on a unix socket behind a proxy parent."""
