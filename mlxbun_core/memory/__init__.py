"""The memory vault: articles on disk (:mod:`.vault`), their revisions (:mod:`.history`),
an FTS5 search index (:mod:`.index`) and synthesis from saved chats (:mod:`.synthesis`).

It knows the engine only as ``engine.parse_chat`` / ``engine.start`` and the chat sessions
only as :class:`.synthesis.Conversation` records its callers build, so the web chat (which
consults the vault) and the server (which serves it) sit above it.
"""
