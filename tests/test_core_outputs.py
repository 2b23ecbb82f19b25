"""Pure tests: tool outputs capped before they become payloads keep their JSON structure - every key
stays, long strings and lists are shortened with a marker, the result is valid JSON within the cap - and
`ok`/`code` are kept."""

from __future__ import annotations

import json

import pytest

from toolloop._core.outputs import CAPPED_KEY, TRUNCATION_MARKER, cap_output, output_size


def keys(value: object, prefix: str = "") -> set[str]:
    """Every key path in a JSON value (list items share their list's path)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            found |= {f"{prefix}{key}", *keys(item, f"{prefix}{key}.")}
    elif isinstance(value, list):
        for item in value:
            found |= keys(item, prefix)
    return found


def test_an_output_that_fits_exactly_is_unchanged() -> None:
    output = {"ok": True, "blob": "x" * 100}
    assert cap_output(output, output_size(output)) is output
    assert cap_output(output, output_size(output) - 1) != output


def test_a_field_after_a_long_one_survives_the_cap() -> None:
    # The case a prefix cut lost: the notes fill the cap, and the version the note tool needs comes after.
    ticket = {
        "ok": True,
        "ticket_id": "T1001",
        "notes": [{"note_id": f"N{i}", "text": "long note text " * 40} for i in range(60)],
        "subject": "Parcel arrived damaged",
        "version": 17,
    }
    capped = cap_output(ticket, 4096)
    assert output_size(capped) <= 4096
    assert capped["version"] == 17 and capped["ticket_id"] == "T1001" and capped["subject"] == ticket["subject"]
    assert keys(capped) == keys(ticket) | {CAPPED_KEY, f"{CAPPED_KEY}.original_bytes"}
    assert capped[CAPPED_KEY] == {"original_bytes": output_size(ticket)}
    notes = capped["notes"]
    assert notes[-1] == f"...[{60 - (len(notes) - 1)} more]"
    kept = notes[:-1]
    assert kept and all(n["note_id"] == f"N{i}" for i, n in enumerate(kept))
    assert all(n["text"].endswith(TRUNCATION_MARKER) for n in kept)


@pytest.mark.parametrize("limit", [256, 300, 1000, 4096, 20_000])
def test_a_capped_output_is_valid_json_within_the_cap_and_nearly_fills_it(limit: int) -> None:
    output = {"ok": True, "code": None, "blob": "abcdefgh" * 5000, "rows": list(range(5000)), "n": 3}
    capped = cap_output(output, limit)
    size = output_size(capped)
    assert limit - 48 < size <= limit
    assert json.loads(json.dumps(capped)) == capped
    assert capped["blob"].endswith(TRUNCATION_MARKER) and output["blob"].startswith(
        capped["blob"][: -len(TRUNCATION_MARKER)]
    )
    assert capped["rows"][-1].startswith("...[") and capped["n"] == 3 and capped["code"] is None


def test_short_strings_and_lists_are_kept_whole() -> None:
    output = {"ok": True, "id": "A100", "tags": ["a", "b"], "body": "x" * 10_000}
    capped = cap_output(output, 512)
    assert capped["id"] == "A100" and capped["tags"] == ["a", "b"]
    assert len(capped["body"]) < 512


def test_a_failure_keeps_ok_false_and_its_code_and_a_missing_ok_is_not_success() -> None:
    failed = cap_output({"ok": False, "code": "NOT_AVAILABLE", "message": "m" * 5000}, 512)
    assert (failed["ok"], failed["code"]) == (False, "NOT_AVAILABLE")
    assert failed["message"].endswith(TRUNCATION_MARKER)
    unclear = cap_output({"blob": "z" * 5000}, 512)
    assert unclear["ok"] is False and "code" not in unclear and unclear["blob"].endswith(TRUNCATION_MARKER)


@pytest.mark.parametrize("filler", ["\u00e9", "\U0001f600", '"', "\\", "\x01"])
def test_multibyte_and_escaped_text_is_cut_into_valid_json_within_the_cap(filler: str) -> None:
    # A cut in the middle of a character, or text that JSON escaping makes longer than its bytes.
    output = {"ok": True, "text": filler * 3000, "after": 1}
    for limit in (256, 257, 258, 259, 1001):
        capped = cap_output(output, limit)
        assert output_size(capped) <= limit
        assert json.loads(json.dumps(capped)) == capped
        assert capped["text"].endswith(TRUNCATION_MARKER) and capped["after"] == 1


def test_more_keys_than_the_cap_holds_falls_back_to_a_marked_preview() -> None:
    output = {"ok": True, **{f"field_{i:05d}": i for i in range(2000)}}
    capped = cap_output(output, 1024)
    assert output_size(capped) <= 1024
    assert capped[CAPPED_KEY] == {"original_bytes": output_size(output), "keys_dropped": True}
    assert capped["preview"].endswith(TRUNCATION_MARKER) and capped["ok"] is True


@pytest.mark.parametrize("code", ["x" * 200_000, ["line"] * 50_000])
def test_a_long_code_field_is_data_and_the_cap_holds(code: object) -> None:
    # A result shaped like Snippet(path, code): `code` was copied into the capped head whole, and 200 KB went
    # through a 16 KB cap.
    capped = cap_output({"ok": True, "path": "src/app.py", "code": code}, 16_384)
    assert output_size(capped) <= 16_384
    assert capped["ok"] is True and capped["path"] == "src/app.py" and capped[CAPPED_KEY]["original_bytes"] > 16_384
