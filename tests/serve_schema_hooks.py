"""Schemathesis hooks of tests/test_serve_schema.py (loaded with SCHEMATHESIS_HOOKS).

`positive_data_fits_window` replaces schemathesis's `positive_data_acceptance` with one
exception, the documented one: a body valid by the schema may still be a 400 when its prompt
does not fit the model's context length, which counts tokens and so no JSON Schema can state.
Every other refusal of valid data (400, 413, 422) fails the run, as it would there.
"""

from __future__ import annotations

import json

import schemathesis
from schemathesis.specs.openapi.checks import is_unexpected_http_status_case

# What schemathesis's own check allows for valid data that needs more than the schema says:
# success, credentials, an unknown name (model, adapter), back-pressure.
ACCEPTED = {401, 404, 429}


def _context_length(response: schemathesis.Response) -> bool:
    try:
        error = json.loads(response.text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (response.status_code == 400 and error.get("type") == "invalid_request_error"
            and "context length" in str(error.get("message", "")).lower())


@schemathesis.check
def positive_data_fits_window(ctx, response, case) -> bool | None:
    meta = case.meta
    # As schemathesis's own check: request-shape probes (no body, another media type) are
    # not positive data.
    if meta is None or not meta.generation.mode.is_positive or is_unexpected_http_status_case(
            case):
        return None
    if response.status_code < 300 or response.status_code in ACCEPTED:
        return None
    if _context_length(response):
        return None
    raise AssertionError(f"valid data refused with {response.status_code}: "
                         f"{response.text[:300]}")
