"""Every client frame of /ws/chat and the type of each field it may carry, checked in one
place before any handler runs: a field of the wrong type is a 400 error frame that names
it, never a ``TypeError`` deep in a handler (a 500 and a traceback in the log).

Handlers still check what a type cannot say (a known session, a value in range); a frame
type the table does not list is refused as unknown, so a new handler needs its row
(``tests/test_webchat_protocol.py`` checks that every handler has one).
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest
from ..request_fields import accepted

NULL = type(None)
STR, BOOL, DICT, LIST = (str,), (bool,), (dict,), (list,)
ANY = (object,)  # checked by the handler itself (sampling values, the page's context)
# set_sampling's fields: request_fields' rows for the web chat, and its completion cap
SAMPLING_KEYS = (*(f.name for f in accepted("webchat")), "max_tokens")

# frame type -> field -> accepted types; a field named in REQUIRED must be present
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "prompt": {"text": STR, "images": LIST + (NULL,)},
    "edit_resend": {"text": STR, "entryId": STR + (NULL,)},
    "regenerate": {"entryId": STR + (NULL,)},
    "abort": {},
    "approval": {"callId": STR, "decision": STR, "alwaysAllow": BOOL + (NULL,),
                 "editedArgs": DICT + (NULL,), "approvalToken": STR + (NULL,)},
    "set_coding_tools": {"enabled": BOOL, "workspace": STR + (NULL,)},
    "set_thinking": {"enabled": BOOL + (NULL,)},
    "set_system_prompt": {"text": STR + (NULL,)},
    "set_adapter": {"id": STR + (NULL,)},
    "set_sampling": {"scope": STR + (NULL,), **{k: ANY for k in SAMPLING_KEYS}},
    "set_overflow": {"policy": STR},
    "set_curve": {"curve": DICT + (NULL,)},
    "context": {"context": ANY},
    "new_session": {},
    "list_sessions": {},
    "open_session": {"path": STR},
    "fork_session": {"path": STR + (NULL,), "entryId": STR + (NULL,)},
    "delete_session": {"path": STR},
    "switch_sibling": {"entryId": STR},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "prompt": ("text",), "edit_resend": ("text",), "approval": ("callId", "decision"),
    "set_coding_tools": ("enabled",), "set_overflow": ("policy",), "open_session": ("path",),
    "delete_session": ("path",), "switch_sibling": ("entryId",)}

_NAMES = {str: "a string", bool: "true or false", dict: "an object", list: "a list",
          int: "a number", float: "a number", NULL: "null"}


def _expected(types: tuple[type, ...]) -> str:
    names = list(dict.fromkeys(_NAMES[t] for t in types))
    return " or ".join(names)


def frame_type(frame: Any) -> str:
    """The frame's ``type``, known to the table; else a 400."""
    kind = frame.get("type") if isinstance(frame, dict) else None
    if not isinstance(kind, str) or kind not in FIELDS:
        raise BadRequest(f"unknown frame type {kind!r}")
    return kind


def check(frame: Any) -> str:
    """The frame's type once every field it carries has the right type (400 otherwise)."""
    kind = frame_type(frame)
    for name in REQUIRED.get(kind, ()):
        if frame.get(name) is None:
            raise BadRequest(f"{kind} needs {name} ({_expected(FIELDS[kind][name])})",
                             param=name)
    for name, types in FIELDS[kind].items():
        if name not in frame or types is ANY:
            continue
        value = frame[name]
        # bool is an int to Python: True is no number here, and no string either
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BadRequest(f"{kind}.{name} must be {_expected(types)} "
                             f"(got {type(value).__name__})", param=name)
    return kind
