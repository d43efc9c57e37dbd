"""API keys without a server (``http/auth.py``): header values in, a key's index or a 401 out."""

from __future__ import annotations

import json

import pytest

from trioserve.http import auth, error_bodies
from trioserve.http.auth import ApiKeys
from trioserve.http.errors import HTTPError

KEYS = ApiKeys(["sk-first", "sk-second"])


def refused(call, *args) -> HTTPError:
    with pytest.raises(HTTPError) as caught:
        call(*args)
    error = caught.value
    assert error.status == 401
    assert error_bodies.payload(error) == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "code": "invalid_api_key",
            "param": None,
        }
    }
    return error


def challenge(error: HTTPError) -> bytes:
    (value,) = [v for k, v in error.headers if k == b"www-authenticate"]
    return value


def test_each_configured_key_is_known_by_its_index():
    assert KEYS.authenticate([b"Bearer sk-first"]) == 0
    assert KEYS.authenticate([b"Bearer sk-second"]) == 1


def test_the_scheme_is_case_insensitive_and_spaces_around_the_token_do_not_matter():
    assert KEYS.authenticate([b"bearer sk-second"]) == 1
    assert KEYS.authenticate([b"BEARER   sk-first  "]) == 0


def test_without_keys_every_request_passes_whatever_it_sends():
    open_ = ApiKeys()
    assert not open_.enabled
    assert open_.authenticate([]) is None
    assert open_.authenticate([b"Basic dXNlcjpwdw=="]) is None
    assert open_.authenticate_websocket([], [b"trioserve.bearer.x"]) is None


def test_a_missing_header_is_refused_without_an_error_attribute_in_the_challenge():
    error = refused(KEYS.authenticate, [])
    assert challenge(error) == b'Bearer realm="trioserve"'  # RFC 6750 section 3.1
    assert "Authorization: Bearer" in error.message


@pytest.mark.parametrize(
    "value",
    [b"Bearer", b"Bearer ", b"Bearer    ", b"Basic c2stZmlyc3Q6", b"sk-first", b"Bearer a b",
     b"Token sk-first", b""],
)  # fmt: skip
def test_a_malformed_header_is_refused(value):
    error = refused(KEYS.authenticate, [value])
    assert challenge(error) == b'Bearer realm="trioserve", error="invalid_token"'


@pytest.mark.parametrize("key", [b"sk-third", b"sk-firs", b"sk-first0", b"SK-FIRST", b"x" * 5000])
def test_a_wrong_key_is_refused_and_the_message_does_not_echo_it(key):
    error = refused(KEYS.authenticate, [b"Bearer " + key])
    assert error.message == auth.WRONG
    assert key.decode() not in json.dumps(error_bodies.payload(error))


def test_two_authorization_headers_are_refused_even_if_one_is_right():
    refused(KEYS.authenticate, [b"Bearer sk-first", b"Bearer sk-first"])
    refused(KEYS.authenticate, [b"Bearer nope", b"Bearer sk-first"])


def test_match_compares_digests_of_every_key():
    keys = ApiKeys(["a", "bb", "a"])  # a duplicate counts once
    assert len(keys) == 2
    assert [keys.match(k) for k in (b"a", b"bb", b"b", b"", b"aa")] == [0, 1, None, None, None]


def test_websocket_takes_the_key_from_the_header_or_a_bearer_subprotocol():
    assert KEYS.authenticate_websocket([b"Bearer sk-second"], []) == 1
    assert KEYS.authenticate_websocket([], [b"trioserve.v1, trioserve.bearer.sk-second"]) == 1
    assert KEYS.authenticate_websocket([], [b"trioserve.v1", b"trioserve.bearer.sk-first"]) == 0
    assert KEYS.authenticate_websocket([b"Bearer sk-first"], [b"trioserve.v1"]) == 0


def test_websocket_refusals():
    assert challenge(refused(KEYS.authenticate_websocket, [], [b"trioserve.v1"])) == (
        b'Bearer realm="trioserve"'
    )
    refused(KEYS.authenticate_websocket, [], [b"trioserve.bearer.wrong"])
    refused(KEYS.authenticate_websocket, [], [b"trioserve.bearer."])
    # Two credentials, even the same key twice: ambiguous.
    refused(KEYS.authenticate_websocket, [b"Bearer sk-first"], [b"trioserve.bearer.sk-first"])
    refused(KEYS.authenticate_websocket, [], [b"trioserve.bearer.sk-first, trioserve.bearer.x"])


def test_the_selected_subprotocol_is_never_the_key_bearing_token():
    assert auth.select_subprotocol([b"trioserve.bearer.sk-first, trioserve.v1"]) == "trioserve.v1"
    assert auth.select_subprotocol([b"trioserve.bearer.sk-first"]) is None
    assert auth.select_subprotocol([]) is None


def test_header_values_collects_every_value_of_a_name():
    headers = [(b"authorization", b"a"), (b"host", b"h"), (b"Authorization", b"b")]
    assert auth.header_values(headers, b"authorization") == [b"a", b"b"]


def test_keys_from_every_source_each_once(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# team keys\n\nsk-file-1\n   sk-file-2  \n# sk-old\nsk-cli\n")
    keys = auth.load_keys(["sk-cli"], str(path), {auth.ENV_VAR: "sk-env"})
    assert keys == ["sk-cli", "sk-file-1", "sk-file-2", "sk-env"]
    assert auth.load_keys([], None, {auth.ENV_VAR: ""}) == []
    assert auth.load_keys([], None, {}) == []


def test_unusable_key_sources_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read the API key file .*missing"):
        auth.load_keys([], str(tmp_path / "missing"), {})
    with pytest.raises(ValueError, match="cannot read the API key file"):
        auth.load_keys([], str(tmp_path), {})  # a directory
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="holds no key"):
        auth.load_keys([], str(empty), {})
    spaced = tmp_path / "spaced"
    spaced.write_text("ok-key\nsk has spaces\n")
    with pytest.raises(ValueError, match="line 2: an API key must be printable ASCII"):
        auth.load_keys([], str(spaced), {})
    with pytest.raises(ValueError, match="printable ASCII"):
        auth.load_keys(["clé"], None, {})
    with pytest.raises(ValueError, match=auth.ENV_VAR):
        auth.load_keys([], None, {auth.ENV_VAR: "a\tb"})


def test_subprotocol_safe_keys():
    assert auth.subprotocol_safe("sk-AbC_123.x~")
    assert not auth.subprotocol_safe("abc/def=")


def test_a_key_file_line_may_name_its_key_and_logs_get_the_name_never_the_key(tmp_path):
    from trioserve.http.auth import key_labels, read_key_file, read_labelled_keys

    path = tmp_path / "keys"
    path.write_text("# team keys\nalice: team-a-secret\nbare-secret\nbob the builder: b-secret\n")
    assert read_key_file(str(path)) == ["team-a-secret", "bare-secret", "b-secret"]
    assert read_labelled_keys(str(path))[2] == ("bob the builder", "b-secret")
    keys = ["from-flag", "team-a-secret", "bare-secret", "b-secret"]
    labels = key_labels(keys, str(path))
    assert labels == ["key-1", "alice", "key-3", "bob the builder"]
    assert not any(key in label for key in keys for label in labels)
    path.write_text('evil"label: key\n')
    with pytest.raises(ValueError, match="line 1"):
        read_key_file(str(path))
