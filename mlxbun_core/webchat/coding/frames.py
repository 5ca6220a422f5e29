"""Client frames of the coding tools: ``set_coding_tools {enabled, workspace}`` and
``approval {callId, decision, approvalToken, alwaysAllow?, editedArgs?}``."""

from __future__ import annotations

import logging

from ...errors import APIError, BadRequest
from ..conversation import Conversation
from .gate import LOOPBACK_ONLY
from .workspace import Workspace, choose

log = logging.getLogger("mlxbun.webchat")


class CodingFrames:
    """Turn the coding tools on (in a folder) or off, and answer approval cards."""

    def __init__(self, conversation: Conversation):
        self.coding = conversation.coding

    async def on_set_coding_tools(self, frame: dict) -> None:
        coding = self.coding
        enabled = frame.get("enabled")
        if not isinstance(enabled, bool):
            raise BadRequest("enabled must be true or false")
        if enabled and not coding.allowed:
            raise APIError(LOOPBACK_ONLY, status=403, type="permission_error")
        if not enabled:
            coding.stop("coding tools were turned off")
            coding.workspace = None
        else:
            raw = frame.get("workspace")
            if raw is None and coding.workspace is None:
                raise BadRequest("workspace required: the folder the tools may use")
            try:
                coding.workspace = Workspace(choose(raw)) if raw is not None else coding.workspace
            except ValueError as exc:
                raise BadRequest(str(exc), param="workspace") from None
        await coding.send_state()

    async def on_approval(self, frame: dict) -> None:
        try:
            await self.coding.decide(frame.get("callId"), frame.get("decision"),
                                     frame.get("alwaysAllow"), frame.get("editedArgs"),
                                     frame.get("approvalToken"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        except PermissionError as exc:
            log.warning("web chat: approval of %s refused: %s", frame.get("callId"),
                        "no approvalToken" if frame.get("approvalToken") is None
                        else "a wrong approvalToken")
            raise APIError(str(exc), status=403, type="permission_error") from None
