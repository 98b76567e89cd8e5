"""Test credentials for a deployment: a CA, the SuperLink's TLS certificate, SuperNode keys.

Everything comes from the ``cryptography`` package (the primitives Flower itself uses); nothing
here is home-made crypto. For a real federation use certificates from your own CA; these are for
trying a deployment on your machines and for the end-to-end test.

* ``ca.crt``: a self-signed CA (ECDSA P-384). SuperNodes verify the SuperLink with it
  (``flower-supernode --root-certificates ca.crt``); ``flwr run`` too (``root-certificates``).
* ``server.crt`` / ``server.key``: the SuperLink's certificate, signed by the CA, valid for the
  host names and addresses given (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile
  server.crt --ssl-keyfile server.key``).
* ``node-<i>`` / ``node-<i>.pub``: each SuperNode's authentication key pair (ECDSA P-384,
  OpenSSH format): the node starts with ``--auth-supernode-private-key node-<i>``, and the
  SuperLink, started with ``--enable-supernode-auth``, admits it once ``flwr supernode register
  node-<i>.pub`` has registered the public key.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from taciturn.deploy.settings import DeployError

VALID_DAYS = 30


def _cryptography():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:  # pragma: no cover (an extra of taciturn[flower])
        raise DeployError(
            "test certificates need the 'cryptography' package: pip install 'taciturn[flower]'"
        ) from None
    return x509, hashes, serialization, ec, NameOID


def _write_new(path: Path, data: bytes, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise DeployError(f"{path} exists; pass --overwrite to replace it")
    path.write_bytes(data)
    if path.suffix in (".key", ""):
        path.chmod(0o600)


def make_credentials(
    folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), nodes: int = 2, overwrite: bool = False
) -> dict[str, Path]:
    """Write a test CA, a SuperLink certificate for ``hosts`` and ``nodes`` SuperNode key pairs."""
    x509, hashes, serialization, ec, NameOID = _cryptography()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM

    def certificate(subject, issuer, public_key, signing_key, ca: bool, sans=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    def key_pem(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "taciturn test CA")])
    ca_cert = certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    sans = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    server_cert = certificate(server_name, ca_name, server_key.public_key(), ca_key, ca=False, sans=sans)
    files = {
        "ca.crt": ca_cert.public_bytes(pem),
        "server.crt": server_cert.public_bytes(pem),
        "server.key": key_pem(server_key),
    }
    for i in range(1, nodes + 1):
        node_key = ec.generate_private_key(ec.SECP384R1())
        files[f"node-{i}"] = node_key.private_bytes(
            pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        files[f"node-{i}.pub"] = node_key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    written = {}
    for name, data in files.items():
        _write_new(folder / name, data, overwrite)
        written[name] = folder / name
    return written
