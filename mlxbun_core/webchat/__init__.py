"""The web chat: sessions kept as JSONL files, and the agent a /ws/chat connection drives.

Nothing here knows BlackSheep or WebSockets: ``webapp/chat_socket.py`` carries frames in and
out, ``webapp/sessions.py`` serves search and export over HTTP.
"""
