"""GET /v1/whoami: who the credential says the caller is, and what they may see."""

from typing import Any

from fastapi import APIRouter

from cocaq.api.deps import Who

router = APIRouter()


@router.get(
    "/v1/whoami", summary="Who the credential says you are, and what you may see", response_model=None
)
def whoami(who: Who) -> dict[str, Any]:
    return {"user": who.user, "uid": who.uid, "admin": who.admin, "lab_head_of": sorted(who.heads)}
