"""OpenAI-style errors: an exception the routes raise and the body every 4xx/5xx answer carries."""

from __future__ import annotations

from pydantic import ValidationError

from treeflash.server.protocol import ErrorInfo, ErrorResponse

INVALID = "invalid_request_error"
# What the fields that accept several shapes accept, said once instead of one complaint per shape.
UNION_FIELDS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of {'type': 'text', 'text': ...} parts",
    "logprobs": "a boolean or an integer",
}


class APIError(Exception):
    """An answer other than 200: HTTP status plus OpenAI's {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type: str = INVALID, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def from_validation(error: ValidationError, fields: set[str]) -> APIError:
    """The first problem pydantic found, named by its field path (e.g. `messages[0].content`).

    fields: the request models' field names. Pydantic adds the member type of a union to the path
    (`prompt.str`); those parts are dropped so the path names only what the client wrote.
    """
    first = error.errors()[0]
    path, field, union = "", None, False
    for part in first["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in fields:
            path += f".{part}" if path else part
            field = part
        else:
            union = True
    kind = first["type"]
    message = first["msg"].removeprefix("Value error, ")
    if kind == "missing":
        message = "this field is required"
    elif kind == "too_short" and first.get("ctx", {}).get("min_length") == 1:
        message = "must not be empty"
    elif union and field in UNION_FIELDS:
        message = f"must be {UNION_FIELDS[field]}"
    return bad_request(f"{path or 'body'}: {message}", param=path or None,
                       code="missing_field" if kind == "missing" else "invalid_value")
