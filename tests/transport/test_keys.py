"""CURVE key files: what trioserve, zmq.auth and a hand all write is read, and every
problem is one ValueError naming the file."""

from __future__ import annotations

import logging
import os
import stat

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from trioserve.transport import keys


def test_zmq_auth_certificates_are_read(tmp_path):
    public_file, secret_file = zmq.auth.create_certificates(tmp_path, "engine")
    os.chmod(secret_file, 0o600)
    z85_public, z85_secret = zmq.auth.load_certificate(secret_file)
    public, secret = keys.read_secret_key(secret_file)
    assert (public, secret) == (z85.decode(z85_public), z85.decode(z85_secret))
    assert keys.read_public_key(public_file) == public
    assert keys.read_public_key(secret_file) == public  # a secret certificate has both


def test_bare_z85_keys_are_read_and_the_public_half_computed(tmp_path):
    z85_public, z85_secret = zmq.curve_keypair()
    (tmp_path / "secret").write_bytes(b"# the engine's\n\n" + z85_secret + b"\n")
    (tmp_path / "secret").chmod(0o600)
    (tmp_path / "public").write_bytes(z85_public)
    public, secret = keys.read_secret_key(tmp_path / "secret")
    assert public == z85.decode(z85_public) == keys.read_public_key(tmp_path / "public")
    assert secret == z85.decode(z85_secret)


def test_a_key_with_an_equals_sign_is_a_key_not_a_property(tmp_path):
    while b"=" not in (pair := zmq.curve_keypair())[0]:
        pass
    (tmp_path / "keys").write_bytes(pair[0] + b"\n")
    assert keys.read_authorized_keys(tmp_path / "keys") == {z85.decode(pair[0])}


def test_authorized_keys_from_a_file_of_lines_or_a_directory_of_certificates(tmp_path):
    publics = [zmq.curve_keypair()[0] for _ in range(3)]
    (tmp_path / "list").write_bytes(b"# frontends\n" + b"\n".join(publics) + b"\n")
    expected = {z85.decode(key) for key in publics}
    assert keys.read_authorized_keys(tmp_path / "list") == expected
    certs = tmp_path / "certs"
    certs.mkdir()
    made = [zmq.auth.create_certificates(certs, f"frontend{n}")[0] for n in range(2)]
    assert keys.read_authorized_keys(certs) == {keys.read_public_key(p) for p in made}


def test_keygen_files_are_private_and_never_overwritten(tmp_path):
    public_path, secret_path = keys.write_keypair(tmp_path / "frontend")
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    public, _ = keys.read_secret_key(secret_path)
    assert keys.read_public_key(public_path) == public
    assert zmq.auth.load_certificate(public_path)[0] == z85.encode(public)
    with pytest.raises(FileExistsError):
        keys.write_keypair(tmp_path / "frontend")


def test_a_secret_others_may_read_is_warned_about(tmp_path, caplog):
    _, secret_path = keys.write_keypair(tmp_path / "k")
    os.chmod(secret_path, 0o644)
    with caplog.at_level(logging.WARNING):
        keys.read_secret_key(secret_path)
    assert "chmod 600" in caplog.text


@pytest.mark.parametrize(
    ("content", "reader", "message"),
    [
        (b"", keys.read_authorized_keys, "no key in it"),
        (b"short\n", keys.read_public_key, "a key is 40 Z85 characters"),
        (b"~" * 40 + b"\n", keys.read_public_key, "not a Z85 key"),
        (b"#" * 10, keys.read_public_key, "0 keys where one public key belongs"),
        (b'curve\n    public-key = "' + b"0" * 40 + b'"\n', keys.read_secret_key, "no secret"),
        (b"x" * (keys.MAX_KEY_FILE + 1), keys.read_public_key, "not a key file"),
    ],
    ids=["empty", "short", "alphabet", "comments-only", "public-as-secret", "huge"],
)
def test_bad_key_files_are_one_clear_error(tmp_path, content, reader, message):
    path = tmp_path / "keyfile"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        reader(path)
    assert str(path) in str(caught.value)


def test_a_missing_file_or_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="No such file"):
        keys.read_public_key(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"without \*\.key certificates"):
        keys.read_authorized_keys(tmp_path)
