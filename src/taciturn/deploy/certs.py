"""Credentials for a deployment: a CA, the SuperLink's TLS certificate, SuperNode keys.

Everything comes from the ``cryptography`` package (the primitives Flower itself uses); nothing
here is home-made crypto. For a federation across organisations use certificates from a CA you
already run; these are for a federation you operate yourself and for the end-to-end tests.

* ``ca.crt`` / ``ca.key``: a self-signed CA (ECDSA P-384, valid ``CA_DAYS``). SuperNodes verify the
  SuperLink with ``ca.crt`` (``flower-supernode --root-certificates ca.crt``); ``flwr run`` too
  (``root-certificates``). ``ca.key`` (mode 0600) stays on the machine that made it: with it a new
  server certificate (another host name, a renewal) is signed by the same CA, so no node needs
  anything new.
* ``server.crt`` / ``server.key``: the SuperLink's certificate, signed by the CA, valid ``days``,
  for the hosts given and always for 127.0.0.1 and localhost: the SuperLink's own ServerApp
  process connects to it there, and a certificate without them leaves every run pending.
  (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.crt --ssl-keyfile server.key``.)
* ``node-<i>`` / ``node-<i>.pub``: each SuperNode's authentication key pair (ECDSA P-384,
  OpenSSH format, no expiry): the node starts with ``--auth-supernode-private-key node-<i>``, and
  the SuperLink, started with ``--enable-supernode-auth``, admits it once ``flwr supernode register
  node-<i>.pub`` has registered the public key.

Run again on the same folder, it keeps what is there (the CA, every node's keys) and adds what is
asked: more nodes (``nodes`` is the total), a new server certificate when the hosts asked are not
all in the old one, it expires within 30 days, or ``renew`` asks (the old one is replaced only if
this CA signed it). The nodes keep their keys and their ca.crt; restart the SuperLink to use it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from taciturn.deploy.settings import DeployError

CA_DAYS = 3650
DEFAULT_DAYS = 365
RENEW_DAYS = 30  # a server certificate expiring sooner is made anew when the folder is updated
LOOPBACK = ("127.0.0.1", "localhost")  # where the SuperLink's own ServerApp reaches it


def _cryptography():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:  # pragma: no cover (a dependency of taciturn[flower])
        raise DeployError(
            "certificates need the 'cryptography' package: pip install 'taciturn[flower]'"
        ) from None
    return x509, hashes, serialization, ec, NameOID


def _write_private(path: Path, data: bytes, overwrite: bool) -> None:
    """A private key, created readable by its owner only (never briefly world-readable)."""
    _write_new(path, data, overwrite, 0o600)


def _write_public(path: Path, data: bytes, overwrite: bool) -> None:
    _write_new(path, data, overwrite, 0o644)


def _write_new(path: Path, data: bytes, overwrite: bool, mode: int) -> None:
    """A new file in ``path``'s place: what was there (with --overwrite) is unlinked first, so a
    link there is replaced, never written through."""
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise DeployError(f"{path} exists; pass --overwrite to replace it")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _names(hosts: tuple[str, ...]):
    x509 = _cryptography()[0]
    names = []
    for host in dict.fromkeys((*hosts, *LOOPBACK)):  # in order, once each
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_credentials(
    folder: Path,
    hosts: tuple[str, ...] = LOOPBACK,
    nodes: int = 2,
    overwrite: bool = False,
    days: int = DEFAULT_DAYS,
    renew: bool = False,
) -> dict[str, Path]:
    """The CA, a server certificate for ``hosts`` (and loopback) valid ``days``, and SuperNode key
    pairs node-1 .. node-``nodes``, in ``folder``: kept where they exist, made where they do not
    (``renew``: a new server certificate in any case; ``overwrite``: everything afresh). What was
    written, by file name."""
    x509, hashes, serialization, ec, NameOID = _cryptography()
    if days < 1 or nodes < 0:
        raise DeployError(f"--days must be >= 1 and --nodes >= 0, got {days} and {nodes}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM
    written: dict[str, Path] = {}

    def key_pem(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    def certificate(subject, issuer, public_key, signing_key, ca: bool, valid: int, sans=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_crt, ca_key_path = folder / "ca.crt", folder / "ca.key"
    if ca_crt.exists() and ca_key_path.exists() and not overwrite:
        try:
            ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
            ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        except ValueError as error:
            raise DeployError(f"{ca_crt} or {ca_key_path} cannot be read ({error}); restore them") from None
        if ca_cert.public_key() != ca_key.public_key():
            raise DeployError(f"{ca_key_path} is not the key of {ca_crt}; restore the pair")
    elif ca_crt.exists() and not overwrite:
        raise DeployError(
            f"{ca_crt} exists without its key ca.key: a server certificate for new hosts cannot be "
            "signed by it; restore ca.key, or pass --overwrite to make a new CA (then every node "
            "needs the new ca.crt)"
        )
    else:
        ca_key = ec.generate_private_key(ec.SECP384R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "taciturn federation CA")])
        ca_cert = certificate(name, name, ca_key.public_key(), ca_key, ca=True, valid=CA_DAYS)
        _write_private(ca_key_path, key_pem(ca_key), overwrite)
        _write_public(ca_crt, ca_cert.public_bytes(pem), overwrite)
        written |= {"ca.crt": ca_crt, "ca.key": ca_key_path}

    server_crt, server_key = folder / "server.crt", folder / "server.key"
    sans = _names(tuple(hosts))
    if overwrite or renew or _needs_server_certificate(server_crt, ca_cert, sans, now):
        key = ec.generate_private_key(ec.SECP384R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, str(hosts[0] if hosts else LOOPBACK[0]))]
        )
        cert = certificate(
            subject, ca_cert.subject, key.public_key(), ca_key, ca=False, valid=days, sans=sans
        )
        _write_private(server_key, key_pem(key), overwrite=True)  # ours: checked just above
        _write_public(server_crt, cert.public_bytes(pem), overwrite=True)
        written |= {"server.crt": server_crt, "server.key": server_key}

    for i in range(1, nodes + 1):
        private, public = folder / f"node-{i}", folder / f"node-{i}.pub"
        if private.exists() and public.exists() and not overwrite:
            continue  # registered already, perhaps: never re-key a node
        node_key = ec.generate_private_key(ec.SECP384R1())
        _write_private(
            private,
            node_key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
            overwrite,
        )
        _write_public(
            public,
            node_key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            ),
            overwrite,
        )
        written |= {private.name: private, public.name: public}
    return written


def _needs_server_certificate(path: Path, ca_cert, sans, now) -> bool:
    """Whether the server certificate at ``path`` must be (re)made: missing, not covering ``sans``,
    or expiring within ``RENEW_DAYS``. One this CA did not sign is the user's: refused."""
    x509 = _cryptography()[0]
    if not path.exists():
        return True
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca_cert)
    except Exception:  # unreadable, or signed by another CA: not ours to replace
        raise DeployError(
            f"{path} was not signed by this folder's CA; taciturn does not replace it (move it away "
            "to make a new one)"
        ) from None
    have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    return not set(sans) <= have or cert.not_valid_after_utc < now + datetime.timedelta(days=RENEW_DAYS)
