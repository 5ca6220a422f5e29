"""Where the hub is, whether we may reach it, and what its failures mean to a user.

``huggingface_hub`` freezes its endpoint, offline switch and token path at import;
a long-running server (and tests) move them with the environment, so every call
here reads the environment at call time and passes the endpoint explicitly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")


def endpoint() -> str:
    """The hub's base URL (``HF_ENDPOINT``, else huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def token_path() -> Path:
    """The token file ``huggingface_hub`` reads (``HF_TOKEN_PATH``, else ``$HF_HOME/token``)."""
    if os.environ.get("HF_TOKEN_PATH"):
        return Path(os.environ["HF_TOKEN_PATH"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "token"


def token() -> str | None:
    """The token a request to the hub carries: ``HF_TOKEN``, else the saved token file."""
    env = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if env:
        return env.strip()
    try:
        saved = token_path().read_text().strip()
    except OSError:
        return None
    return saved or None


def api():  # -> huggingface_hub.HfApi (imported lazily: the CLI starts faster without it)
    """An ``HfApi`` bound to this moment's endpoint and token."""
    from huggingface_hub import HfApi

    from ..models import hub_timeout

    hub_timeout.install()  # no call waits on a silent hub forever
    return HfApi(endpoint=endpoint(), token=token() or False)


def check_repo_id(repo_id: object, field: str = "repo") -> str:
    """``owner/name`` or a :class:`~mlxbun_core.errors.BadRequest` naming the field."""
    from ..errors import BadRequest

    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id.strip()):
        raise BadRequest(f"{field} must be a hub repo id like owner/name", param=field)
    return repo_id.strip()


def explain(exc: BaseException, repo_id: str = "") -> str:
    """A hub failure in words a user can act on (status codes kept for scripts)."""
    from huggingface_hub import errors as hf

    name = repo_id or "the repo"
    if isinstance(exc, hf.GatedRepoError):
        return (f"{name} is gated (401): accept its terms on the hub, then save a token with "
                "access (Settings in the web app, `hf auth login`, or HF_TOKEN)")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return (f"{name} was not found on the hub (404): check the spelling; a private repo "
                "also needs a token")
    if isinstance(exc, hf.RevisionNotFoundError):
        return f"{name} has no such revision (404)"
    if isinstance(exc, hf.EntryNotFoundError):
        return f"a file of {name} is missing on the hub (404): {exc}"
    if isinstance(exc, hf.OfflineModeIsEnabled) or offline():
        return "offline: HF_HUB_OFFLINE is set, so the hub is not asked (cached models still work)"
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return f"the hub refused the token (401) for {name}: save a valid token"
        if status == 403:
            return f"the hub refused access (403) to {name}: the token lacks the permission"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"the hub answered {status} for {name}: {first}"
    if _is_timeout(exc):
        from ..models.hub_timeout import seconds

        return (f"the hub {endpoint()} did not answer within {seconds():g} s "
                f"({type(exc).__name__}; MLXBUN_HUB_TIMEOUT sets the wait); "
                "cached models still work")
    if is_network(exc):
        return (f"offline: the hub {endpoint()} cannot be reached ({type(exc).__name__}); "
                "cached models still work")
    return f"{type(exc).__name__}: {exc}"


_NETWORK = {"TransportError", "TimeoutException", "NetworkError", "ConnectError"}


def _is_timeout(exc: BaseException) -> bool:
    """A hub that stayed silent past the deadline (httpx's or httpx2's timeouts)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError) or any(
                k.__name__ == "TimeoutException" for k in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_network(exc: BaseException) -> bool:
    """A connection that failed (httpx or httpx2, whichever huggingface_hub uses)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError)) or any(
                k.__name__ in _NETWORK for k in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
