"""The primitives SecAgg is built from, all from libraries (never hand-rolled):

* key agreement: X25519 (``cryptography``), the shared secret expanded by HKDF-SHA256 into a
  32-byte key (Bonawitz et al. 2017, Sec. 3 "Key Agreement" + "Authenticated Encryption");
* PRG: AES-256 in counter mode over a zero stream, keyed by a 32-byte seed (their "PRG"), read as
  little-endian uint32 words, i.e. uniform elements of Z_{2^32};
* authenticated encryption of the shares: AES-256-GCM with a fresh 12-byte nonce;
* t-out-of-n secret sharing: Shamir over GF(2^128) from ``pycryptodome`` (two 16-byte chunks for
  a 32-byte secret; shares indexed 1..n).

Every secret (key pairs, self-mask seeds, nonces) comes from the operating system's CSPRNG
(``os.urandom``; ``X25519PrivateKey.generate`` reads it too), never from the run's seeded streams:
the seed is public, and keys derived from it would let anyone unmask every update.
"""

from __future__ import annotations

import os

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

KEY_BYTES = 32
NONCE_BYTES = 12
SHARE_BYTES = 2 * 16  # a 32-byte secret shared as two 16-byte chunks


def private_key(secret: bytes) -> X25519PrivateKey:
    """The key whose 32 private bytes are ``secret`` (a key rebuilt from its Shamir shares)."""
    return X25519PrivateKey.from_private_bytes(secret)


def fresh_key() -> X25519PrivateKey:
    """A new key pair from the OS CSPRNG."""
    return X25519PrivateKey.generate()


def fresh_secret(size: int = KEY_BYTES) -> bytes:
    """``size`` bytes from the OS CSPRNG: a self-mask seed or a nonce."""
    return os.urandom(size)


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(own: X25519PrivateKey, other_public: bytes, purpose: bytes) -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 of the X25519 shared secret."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(other_public))
    return HKDF(hashes.SHA256(), KEY_BYTES, salt=None, info=b"taciturn-secagg/" + purpose).derive(shared)


def prg(seed: bytes, length: int) -> np.ndarray:
    """``length`` uniform uint32 values from AES-256-CTR keyed by ``seed`` (nonce zero: one use per key)."""
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(encryptor.update(b"\0" * (4 * length)) + encryptor.finalize(), dtype="<u4")


def encrypt(key: bytes, nonce: bytes, plaintext: bytes) -> bytes:
    return nonce + AESGCM(key).encrypt(nonce, plaintext, None)


def decrypt(key: bytes, ciphertext: bytes) -> bytes:
    return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], None)


def split(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` Shamir shares of a 32-byte secret, any ``threshold`` of which rebuild it; share i
    (1-based) is the 32 bytes of its two chunk shares."""
    halves = [Shamir.split(threshold, count, secret[i : i + 16]) for i in (0, 16)]
    return [a[1] + b[1] for a, b in zip(*halves, strict=True)]


def combine(shares: dict[int, bytes]) -> bytes:
    """The secret from shares {index (1-based): share}."""
    return b"".join(Shamir.combine([(i, s[h : h + 16]) for i, s in shares.items()]) for h in (0, 16))
