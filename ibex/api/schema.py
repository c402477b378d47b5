"""OpenAPI post-processing: document the error responses every operation can give.

drf-spectacular documents only the success responses; every 4xx the API answers has the one
shape of `ibex.api.errors.error_body`, so each operation gets a `4XX` response with it.
"""

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["code", "message", "fields"],
        },
    },
    "required": ["error"],
}

ERROR_RESPONSE = {
    "description": "Refused: {error: {code, message, fields}}",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def document_errors(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method in HTTP_METHODS:
                operation.setdefault("responses", {}).setdefault("4XX", ERROR_RESPONSE)
    return result
