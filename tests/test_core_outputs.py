"""Pure tests: tool outputs capped before they become payloads: always valid JSON within the cap, as much
of the original as fits, the marker, and `ok`/`code` kept."""

from __future__ import annotations

import json

import pytest

from toolloop._core.outputs import TRUNCATION_MARKER, cap_output, output_size


def test_an_output_that_fits_exactly_is_unchanged() -> None:
    output = {"ok": True, "blob": "x" * 100}
    assert cap_output(output, output_size(output)) is output
    assert cap_output(output, output_size(output) - 1) != output


@pytest.mark.parametrize("limit", [256, 300, 1000, 4096])
def test_a_capped_output_fills_the_cap_and_never_exceeds_it(limit: int) -> None:
    output = {"ok": True, "code": None, "blob": "abcdefgh" * 2000}
    capped = cap_output(output, limit)
    size = output_size(capped)
    # As much as fits: plain ASCII text fills the cap to the byte, never over it.
    assert size == limit
    assert capped["truncated"] is True and capped["original_bytes"] == output_size(output)
    assert capped["preview"].endswith(TRUNCATION_MARKER)
    assert json.dumps(output, separators=(",", ":"), sort_keys=True).startswith(
        capped["preview"][: -len(TRUNCATION_MARKER)]
    )


def test_a_failure_keeps_ok_false_and_its_code_and_a_missing_ok_is_not_success() -> None:
    failed = cap_output({"ok": False, "code": "NOT_AVAILABLE", "message": "m" * 5000}, 512)
    assert (failed["ok"], failed["code"]) == (False, "NOT_AVAILABLE")
    unclear = cap_output({"blob": "z" * 5000}, 512)
    assert unclear["ok"] is False and "code" not in unclear


@pytest.mark.parametrize("filler", ["\u00e9", "\U0001f600", '"', "\\", "\x01"])
def test_multibyte_and_escaped_text_is_cut_into_valid_json_within_the_cap(filler: str) -> None:
    # A cut in the middle of a character, or text that JSON escaping makes longer than its bytes.
    output = {"ok": True, "text": filler * 3000}
    for limit in (256, 257, 258, 259, 1001):
        capped = cap_output(output, limit)
        assert output_size(capped) <= limit
        assert json.loads(json.dumps(capped)) == capped and capped["preview"].endswith(TRUNCATION_MARKER)
