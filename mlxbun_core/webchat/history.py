"""How a session's messages read on the page: one ``history`` item per entry, with its
images, reasoning, tool calls and its place among its siblings."""

from __future__ import annotations

from .store import Session, message_text


def history_item(session: Session, entry: dict) -> dict:
    """A message entry as the page renders it."""
    msg = entry["message"]
    item = {"id": entry["id"], "parentId": entry.get("parentId"), "role": msg.get("role"),
            "content": message_text(msg)}
    if isinstance(msg.get("content"), list):
        urls = [p["image_url"]["url"] for p in msg["content"]
                if isinstance(p, dict) and p.get("type") == "image_url"]
        if urls:
            item["images"] = urls
    if msg.get("reasoning_content"):
        item["reasoning"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        item["toolCalls"] = [{"id": c.get("id"), "name": c["function"]["name"],
                              "arguments": c["function"].get("arguments")}
                             for c in msg["tool_calls"]]
    if msg.get("role") == "tool":
        item["toolCallId"], item["name"] = msg.get("tool_call_id"), msg.get("name")
    if entry.get("meta"):
        item["meta"] = entry["meta"]
    sibs = session.siblings(entry["id"])
    if len(sibs) > 1:
        item["siblings"] = {"index": sibs.index(entry["id"]), "count": len(sibs), "ids": sibs}
    return item


def first_answer(session: Session, entry_id: str) -> str:
    """The first assistant message after the user message that ``entry_id`` answers."""
    msgs = session.messages
    while True:
        parent = msgs[entry_id].get("parentId")
        if parent is None or msgs[parent]["message"].get("role") == "user":
            return entry_id
        entry_id = parent
