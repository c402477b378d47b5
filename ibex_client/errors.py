"""One exception for everything the client can be refused: `ApiError`.

The server answers every refusal as `{"error": {"code", "message", "fields"}}` (ibex.api.errors);
`ApiError` carries that `code`, the first `field` it names and a `message` a person can read.
Failures on this side of the wire (no answer, no configuration, an answer that is not the API's
JSON) are `ApiError`s too, with `status` None and codes of their own, so a caller catches one
class.
"""

from __future__ import annotations

UNREACHABLE = "unreachable"  # no HTTP answer: refused, not resolved, timed out
NOT_CONFIGURED = "not_configured"  # no API address or key
BAD_ANSWER = "bad_answer"  # an answer that is not the API's JSON


class ApiError(Exception):
    def __init__(self, message: str, *, code: str = "error", field: str | None = None,
                 status: int | None = None, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        self.status = status
        self.fields = fields or {}

    @classmethod
    def from_response(cls, status: int, body) -> ApiError:
        """The API's error body as an ApiError; the generic "Invalid input." becomes the
        first field's own message, so the message says what is wrong."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return cls(f"the server answered {status} without the API's error body",
                       code=BAD_ANSWER if status < 500 else "server_error", status=status)
        fields = {str(name): [str(m) for m in (messages if isinstance(messages, list)
                                               else [messages])]
                  for name, messages in (error.get("fields") or {}).items()}
        field = next(iter(fields), None)
        message = str(error.get("message") or "")
        if field is not None and (not message or message == "Invalid input."):
            message = "; ".join(fields[field])
        return cls(message or f"HTTP {status}", code=str(error.get("code") or "error"),
                   field=field, status=status, fields=fields)

    @property
    def retryable(self) -> bool:
        return self.code == UNREACHABLE or (self.status is not None and self.status >= 500)

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        others = [f"{name}: {'; '.join(msgs)}" for name, msgs in self.fields.items()
                  if name != self.field]
        return "; ".join([text, *others])

    def to_json(self) -> dict:
        return {"code": self.code, "field": self.field, "message": self.message,
                "status": self.status, "fields": self.fields}
