"""The web chat: sessions kept as JSONL files, and the agent a /ws/chat connection drives.

Nothing here knows BlackSheep or WebSockets: ``server/ws_chat.py`` carries frames in and
out, ``server/sessions.py`` serves search and export over HTTP.
"""
